//! Header lists as stored by every backend: a JSON array of `[name, value]`
//! pairs (key records' responses, outbox messages, webhook receipts).

/// Response headers that are never stored with an outcome nor replayed,
/// whatever a route or a workflow says: they carry credentials or
/// per-client state.
pub const NEVER_STORED: &[&str] = &[
    "set-cookie",
    "authorization",
    "www-authenticate",
    "proxy-authenticate",
    "proxy-authorization",
];

/// `headers` without the [`NEVER_STORED`] ones (names compared without
/// regard to case).
pub fn storable(headers: Vec<(String, String)>) -> Vec<(String, String)> {
    headers
        .into_iter()
        .filter(|(n, _)| !NEVER_STORED.iter().any(|x| n.eq_ignore_ascii_case(x)))
        .collect()
}

/// Encodes headers for storage as a JSON array of `[name, value]` pairs.
pub fn to_json(headers: &[(String, String)]) -> String {
    serde_json::Value::Array(
        headers
            .iter()
            .map(|(n, v)| serde_json::json!([n, v]))
            .collect(),
    )
    .to_string()
}

/// Decodes headers written by [`to_json`].
pub fn from_json(json: &str) -> Option<Vec<(String, String)>> {
    serde_json::from_str(json).ok()
}
