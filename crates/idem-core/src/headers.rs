//! Header lists as stored by every backend: a JSON array of `[name, value]`
//! pairs (key records' responses, outbox messages, webhook receipts).

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
