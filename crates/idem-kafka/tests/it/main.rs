//! idem-kafka against a real Kafka-protocol broker (the Tansu that `cargo
//! xtask test` starts), real SQLite files and the suite's PostgreSQL.
#![allow(clippy::unwrap_used, missing_docs)]

mod broker_kill;
mod drill;
mod flows;
mod ledger;
mod rebalance;
mod support;
