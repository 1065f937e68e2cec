//! Runs the example: the retried order is made once, and the admin API
//! (mounted beside the route) lists its key and counts the two answers
//! (executed, replayed) through the outcome ring.

use std::process::Command;

#[test]
fn the_same_key_makes_one_order_and_the_admin_api_lists_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_example-client-and-admin"))
        .env("IDEM_ADMIN_TOKEN", "3f9c2a7d81e04b6f95d2c8a1e7b30f46")
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "200 order 1 replayed=false",
            "200 order 1 replayed=true",
            "admin: 200 1 key(s)",
            r#"overview: {"executed":1,"replayed":1}"#,
            "orders made: 1",
        ],
        "{stderr}"
    );
}
