//! The store's clock is the server's: `PgStore::database_clock` (and
//! `KeyStore::clock`) read what `clock_timestamp()` reads, within the
//! clock's error bound, whatever this host's wall clock says.

use std::process::Command;
use std::time::Duration;

use idem_core::{Clock, KeyStore, SystemClock};
use idem_postgres::{PgConfig, PgStore};
use idem_testkit::postgres_admin_url;

/// The server's clock, in unix milliseconds (rounded down, like the store's).
const SERVER_NOW_MS: &str = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// A bound in whole milliseconds, rounded up, plus the millisecond both
/// readings are truncated to.
fn ms(bound: Duration) -> i64 {
    i64::try_from(bound.as_micros().div_ceil(1000)).unwrap() + 1
}

/// Each reading of the server's clock falls between the store clock's
/// readings just before and just after it, give or take the error bound.
/// Prints how far this host's wall clock is from the server's, which the
/// next test reads when it runs this one under a shifted clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_clock_reads_the_servers_time() {
    let store = PgStore::connect(&postgres_admin_url(), PgConfig::default())
        .await
        .unwrap();
    let clock = store.dialect().database_clock().clone();
    let shared = KeyStore::clock(&store);
    let mut host_ahead_ms = 0;
    let mut widest = Duration::ZERO;
    for i in 0..50 {
        if i == 25 {
            clock.refresh().await.unwrap();
        }
        let before = clock.now_ms();
        let server: i64 = sqlx::query_scalar(SERVER_NOW_MS)
            .fetch_one(store.pool())
            .await
            .unwrap();
        let after = shared.now_ms();
        let bound = clock.error_bound();
        widest = widest.max(bound);
        assert!(
            before - ms(bound) <= server && server <= after + ms(bound),
            "the server read {server}, the store's clock {before}..{after} (± {bound:?})"
        );
        host_ahead_ms = SystemClock.now_ms() - server;
    }
    assert!(
        widest < Duration::from_millis(50),
        "on loopback the bound stays small: {widest:?}"
    );
    println!("store clock: host_ahead_ms={host_ahead_ms} widest_error_bound={widest:?}");
}

/// The same test, run in a process of its own whose wall clock is an hour
/// ahead (libfaketime; its monotonic clock is the host's): it passes, so
/// the store's clock read the server's time and not the host's.
#[test]
fn the_store_clock_ignores_a_host_clock_an_hour_off() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "clock::the_store_clock_reads_the_servers_time",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(idem_testkit::clock_offset_env(3600))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "under a clock an hour ahead:\n{stdout}\n{stderr}"
    );
    let ahead: i64 = stdout
        .split("host_ahead_ms=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no host_ahead_ms in:\n{stdout}"));
    assert!(
        (ahead - 3_600_000).abs() < 5_000,
        "the child's wall clock was {ahead} ms ahead of the server's, not an hour"
    );
    let bound = stdout
        .split("widest_error_bound=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or("?");
    println!(
        "store clock under a host clock an hour ahead: host_ahead_ms={ahead} \
         widest_error_bound={bound} (50 readings of the server's clock within it)"
    );
}
