//! The demo routes' settings.

/// Settings of the demo routes.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// How long key records live (default 24 h).
    pub key_ttl: std::time::Duration,
    /// How the payment and refund routes claim a fresh key (default
    /// pessimistic).
    pub claim_mode: idem_core::ClaimMode,
    /// Largest request body accepted (default 1 MiB); 413 above.
    pub max_body_bytes: usize,
    /// Whether payments and refunds write their events to the outbox (on
    /// when a broker is configured; without a relay they would only pile up).
    pub events: bool,
    /// How long a handler may run before it is rolled back with 503
    /// `handler-timeout` (default 30 s).
    pub handler_timeout: std::time::Duration,
    /// How long a read route waits for the database before 503 (default
    /// 11 s, the PostgreSQL store's deadline).
    pub read_timeout: std::time::Duration,
    /// Mount the benchmark's baseline route, `POST
    /// /v1/payments-baseline`: the payment route's work without the
    /// idempotency layer (default off; `idem serve --bench-routes`).
    pub bench_routes: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            key_ttl: idem_core::Policy::DEFAULT_TTL,
            claim_mode: idem_core::ClaimMode::Pessimistic,
            max_body_bytes: 1 << 20,
            events: false,
            handler_timeout: std::time::Duration::from_secs(30),
            read_timeout: std::time::Duration::from_secs(11),
            bench_routes: false,
        }
    }
}
