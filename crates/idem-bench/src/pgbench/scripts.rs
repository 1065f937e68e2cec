//! The pgbench scripts: Idem's own statements (see the module above for
//! where they come from), with pgbench variables for what the library binds.

use crate::report::{PG_BARE, PG_BARE_DEMO, PG_FRESH, PG_OPTIMISTIC, PG_PIPELINE, PG_SELECT};

/// The next id of this client.
const NEXT_ID: &str = "\\set n :n + 1\n\\set id :base + :client_id * 100000000 + :n\n";

const BUSINESS_INSERT: &str = "INSERT INTO bench_payments (id, amount) VALUES (:id, :amount);\n";

const CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES (:tenant, :operation, :id, :hash, 'pending', NULL, :now, :now, :expires)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING 1;
";

const COMPLETE: &str = "\
UPDATE idem_keys SET state = :state, status_code = :status, response_headers = :headers, response_body = :body,
       resource_type = NULL, resource_id = NULL, locked_until_ms = NULL, updated_at_ms = :now
WHERE tenant_id = :tenant AND operation = :operation AND idempotency_key = :id AND state = 'pending';
";

/// `SELECT_RECORD` of the key in pgbench variable `key`: of the stored
/// record, or the read-first step's read of the key about to be claimed.
fn select_record(key: &str) -> String {
    format!(
        "SELECT request_hash, state, status_code, response_headers, response_body, resource_type,
       resource_id, locked_until_ms, created_at_ms, expires_at_ms, on_unknown
FROM idem_keys WHERE tenant_id = :tenant AND operation = :operation AND idempotency_key = {key};
"
    )
}

const OPTIMISTIC_RECORD: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state, status_code,
                       response_headers, response_body, resource_type, resource_id,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES (:tenant, :operation, :id, :hash, :state, :status, :headers, :body, NULL, NULL,
        NULL, :now, :now, :expires)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING;
";

/// `INSERT_PAYMENT` of `demo/sql/statements.rs`, the business insert of
/// `POST /v1/payments` (no reference: `NULL`).
const DEMO_INSERT: &str = "\
INSERT INTO demo_payments (tenant_id, id, amount, currency, customer, reference, created_at_ms)
VALUES (:tenant, :id, :amount, :currency, :customer, NULL, :now)
ON CONFLICT (tenant_id, reference) DO NOTHING RETURNING id;
";

/// The scripts, as (path in the table, file name, text).
pub(super) fn scripts() -> Vec<(&'static str, &'static str, String)> {
    vec![
        (
            PG_BARE,
            "bare.sql",
            format!("{NEXT_ID}BEGIN;\n{BUSINESS_INSERT}END;\n"),
        ),
        (
            PG_FRESH,
            "fresh.sql",
            // The library's four messages: the read; BEGIN with the claim;
            // the business insert; the record with COMMIT (a pipeline is
            // one round trip, as the library's simple-query message is).
            format!(
                "{NEXT_ID}{}\\startpipeline\nBEGIN;\n{CLAIM}\\endpipeline\n{BUSINESS_INSERT}\
                 \\startpipeline\n{COMPLETE}END;\n\\endpipeline\n",
                select_record(":id::text")
            ),
        ),
        (
            PG_PIPELINE,
            "pipeline.sql",
            format!(
                "{NEXT_ID}\\startpipeline\nBEGIN;\n{CLAIM}{BUSINESS_INSERT}{COMPLETE}END;\n\\endpipeline\n"
            ),
        ),
        (PG_SELECT, "select.sql", select_record(":key")),
        (
            PG_OPTIMISTIC,
            "optimistic.sql",
            // The read; BEGIN; the business insert; the record with COMMIT.
            format!(
                "{NEXT_ID}{}BEGIN;\n{BUSINESS_INSERT}\\startpipeline\n{OPTIMISTIC_RECORD}COMMIT;\n\\endpipeline\n",
                select_record(":id::text")
            ),
        ),
        (
            PG_BARE_DEMO,
            "bare_demo.sql",
            format!("{NEXT_ID}BEGIN;\n{DEMO_INSERT}END;\n"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_but_the_select_inserts_a_new_id() {
        for (path, _, text) in scripts() {
            assert_eq!(text.contains(":id"), path != PG_SELECT, "{path}");
            assert_eq!(text.starts_with(NEXT_ID), path != PG_SELECT, "{path}");
        }
    }
}
