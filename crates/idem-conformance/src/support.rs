//! What every check shares: the scope, fingerprint and response the
//! checks use, and the clock and lease they start from.

use std::time::Duration;

use idem_core::{
    Fingerprint, FingerprintSpec, Finished, IdempotencyKey, Operation, RequestParts, Scope,
    StoredResponse, Tenant,
};

/// The scope of `key` for `tenant`, on the operation the checks use.
pub fn scope(tenant: &str, key: &str) -> Scope {
    Scope::new(
        Tenant::new(tenant).unwrap(),
        Operation::new("payments.create").unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

/// The fingerprint of a `POST` with this JSON body, as the checks compute it.
pub fn fingerprint(body: &str) -> Fingerprint {
    let op = Operation::new("payments.create").unwrap();
    FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/v1/payments",
        json: true,
        body: body.as_bytes(),
    })
}

/// A JSON response to store.
pub fn response(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

/// The clock the outbox, inbox and webhook checks start from (ms).
pub(crate) const NOW: i64 = 1_000_000;
/// The lease the outbox and webhook checks claim with.
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// Asserts that a pessimistic finish stored the outcome and committed.
pub(crate) fn committed(finished: Finished) {
    assert!(matches!(finished, Finished::Committed), "{finished:?}");
}

/// Whether an outcome ran now, and the answer it carries.
pub(crate) fn answered(
    out: idem_core::Outcome<idem_core::Completion>,
) -> (bool, Option<StoredResponse>) {
    match out {
        idem_core::Outcome::Executed(c) => (true, Some(c.response)),
        idem_core::Outcome::Replayed(r) => (false, r.response),
    }
}
