//! What the demo apps need of a store.

use idem_core::steps::RunStore;
use idem_sql::patterns::PatternExec;

use crate::sql::DemoSql;

/// What the demo apps need of a store: their own SQL ([`DemoSql`]), and the
/// checkout's runs, whose transactions run the database patterns. Both
/// backends are one; a gateway's server never asks for it.
pub trait Store: DemoSql + RunStore<Tx: PatternExec> {}

impl<S: DemoSql + RunStore<Tx: PatternExec>> Store for S {}
