//! [`PgClock`]: the database server's clock, as this process follows it.
//!
//! Several processes on several hosts share one PostgreSQL database and its
//! leases. Were each to judge a lease by its own host's clock, a process
//! whose clock runs a lease ahead would see every live lease as expired and
//! take it over. So every lease, takeover and expiry is judged by one clock,
//! the server's: the store samples `clock_timestamp()` and runs on from the
//! sample with this process's monotonic clock, which a wrong or stepped wall
//! clock does not move (the arithmetic is `idem_core::ReferenceClock`'s).
//!
//! # What is assumed
//! - The database server's clock is the reference; whether it is right does
//!   not matter, only that every process reads the same one. A server set
//!   back or forward is followed at the next sample.
//! - This host's monotonic clock runs at the rate of the server's wall clock
//!   within [`MAX_DRIFT_PPM`](idem_core::clock::MAX_DRIFT_PPM) (1 ms a
//!   second), the limit of the kernel's NTP slew plus an uncorrected quartz.
//!   NTP is not needed on the application hosts.
//! - A failover to a replica whose clock disagrees shows as a step, followed
//!   at the next sample ([`RESAMPLE_EVERY`]).
//!
//! # Error bound
//! Half the round trip of the best sample plus the drift since: on a local
//! network under a millisecond at first, a few tens of milliseconds just
//! before a resample. Two processes read times at most the sum of their
//! bounds apart, against leases of seconds.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use idem_core::{Clock, ClockSample, ReferenceClock, StoreError};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::map_err;

/// How often the server's clock is sampled again, in the background.
pub const RESAMPLE_EVERY: Duration = Duration::from_secs(30);

/// Samples per refresh, on one connection; the tightest is kept. The first
/// on a fresh connection also prepares the statement, a round trip more.
const SAMPLES: usize = 3;

/// The server's clock in unix microseconds: the time it reads now, not the
/// transaction's start (`now()`).
const SERVER_NOW_US: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8";

/// The database server's clock, followed from samples of its
/// `clock_timestamp()` (see the [module docs](self) for what is assumed and
/// the error bound). Cheap to clone; clones share the samples.
///
/// Taken by [`PgStore::connect`](crate::PgStore::connect) on a session of its
/// own (closed after), and resampled every [`RESAMPLE_EVERY`] on a pooled
/// connection in a task that ends once the store and every clone of the
/// clock are dropped. A failed resample keeps the sample it has.
#[derive(Clone)]
pub struct PgClock {
    inner: Arc<Inner>,
}

struct Inner {
    reference: ReferenceClock,
    pool: PgPool,
    deadline: Duration,
}

impl PgClock {
    /// Samples the server on a session of its own, opened with `options`
    /// and closed after — the pool's connections are left as they were —
    /// and starts the background resampling through `pool`. Each round of
    /// samples is bounded by `deadline`.
    pub(crate) async fn start(
        options: &PgConnectOptions,
        pool: PgPool,
        deadline: Duration,
    ) -> Result<Self, StoreError> {
        let first = within(deadline, async {
            let mut conn = options.connect().await.map_err(map_err)?;
            let sample = burst(&mut conn).await;
            // Best effort: the server ends the session anyway when it goes.
            let _ = conn.close().await;
            sample
        })
        .await?;
        let clock = Self {
            inner: Arc::new(Inner {
                reference: ReferenceClock::new(first),
                pool,
                deadline,
            }),
        };
        tokio::spawn(resample(Arc::downgrade(&clock.inner)));
        Ok(clock)
    }

    /// Samples the server's clock now and keeps the result when it is
    /// better than the sample the clock follows (the background task does
    /// this every [`RESAMPLE_EVERY`]). On an error the clock goes on from
    /// the sample it has.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is kept until a sample is complete.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let sample = within(self.inner.deadline, async {
            let mut conn = self.inner.pool.acquire().await.map_err(map_err)?;
            burst(&mut conn).await
        })
        .await?;
        self.inner.reference.offer(sample, Instant::now());
        Ok(())
    }

    /// How far [`Clock::now_ms`] may be from the server's clock now (give
    /// or take the millisecond it is truncated to).
    pub fn error_bound(&self) -> Duration {
        self.inner.reference.error_bound()
    }

    /// The sample the clock follows.
    pub fn sample(&self) -> ClockSample {
        self.inner.reference.sample()
    }
}

impl Clock for PgClock {
    fn now_ms(&self) -> i64 {
        self.inner.reference.now_ms()
    }
}

impl std::fmt::Debug for PgClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClock")
            .field("now_ms", &self.now_ms())
            .field("error_bound", &self.error_bound())
            .finish()
    }
}

/// [`SAMPLES`] samples on `conn`, the tightest returned.
async fn burst(conn: &mut PgConnection) -> Result<ClockSample, StoreError> {
    let mut best: Option<ClockSample> = None;
    for _ in 0..SAMPLES {
        let sent = Instant::now();
        let server_us: i64 = sqlx::query_scalar(SERVER_NOW_US)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
        let sample = ClockSample::new(sent, server_us, Instant::now());
        if best.is_none_or(|b| sample.round_trip() < b.round_trip()) {
            best = Some(sample);
        }
    }
    best.ok_or_else(|| StoreError::Database {
        source: "no clock sample taken".into(),
    })
}

/// `samples`, unless the server takes longer than `deadline` to tell its time.
async fn within(
    deadline: Duration,
    samples: impl Future<Output = Result<ClockSample, StoreError>>,
) -> Result<ClockSample, StoreError> {
    match tokio::time::timeout(deadline, samples).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Unavailable {
            source: format!("PostgreSQL did not tell its time within {deadline:?}").into(),
        }),
    }
}

/// Resamples every [`RESAMPLE_EVERY`] while anyone holds the clock.
async fn resample(weak: Weak<Inner>) {
    loop {
        tokio::time::sleep(RESAMPLE_EVERY).await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let clock = PgClock { inner };
        if let Err(e) = clock.refresh().await {
            tracing::warn!(
                error = %idem_core::ErrorChain(&e),
                "could not sample the database's clock; going on from the last sample"
            );
        }
    }
}
