//! The demo's migrations (the `demo` component), per backend.

use idem_core::Migration;

const DEMO_PAYMENTS: Migration = Migration {
    version: 1,
    name: "demo_payments",
    sql: include_str!("../../migrations/0001_demo.sql"),
};
const DEMO_EFFECTS: Migration = Migration {
    version: 2,
    name: "demo_effects",
    sql: include_str!("../../migrations/0002_demo_effects.sql"),
};
const DEMO_CHECKOUT: Migration = Migration {
    version: 4,
    name: "demo_checkout",
    sql: include_str!("../../migrations/0004_demo_checkout.sql"),
};

/// The demo's tables on SQLite.
pub const SQLITE_MIGRATIONS: &[Migration] = &[
    DEMO_PAYMENTS,
    DEMO_EFFECTS,
    Migration {
        version: 3,
        name: "demo_refund_check",
        sql: include_str!("../../migrations/sqlite/0003_demo_refund_check.sql"),
    },
    DEMO_CHECKOUT,
];

/// The demo's tables on PostgreSQL.
pub const POSTGRES_MIGRATIONS: &[Migration] = &[
    DEMO_PAYMENTS,
    DEMO_EFFECTS,
    Migration {
        version: 3,
        name: "demo_refund_check",
        sql: include_str!("../../migrations/postgres/0003_demo_refund_check.sql"),
    },
    DEMO_CHECKOUT,
];
