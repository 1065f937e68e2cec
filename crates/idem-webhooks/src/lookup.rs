//! Finding a stored delivery by the id an operator types.

use idem_core::StoreError;
use idem_core::webhooks::{Receipt, Requeue, WebhookStore};

use crate::endpoint::{Endpoint, bounded_delivery_id};

/// The stored delivery ids an operator may mean by `given`, in the order
/// tried: as given, then without a leading `<endpoint>:` — the form the
/// upstream sees in `Idempotency-Key` (`github:4242:72d3…`). Each is mapped as
/// the receiver maps ids (over 255 bytes: `sha256:<hex>`). Input no stored
/// receipt can match (an invalid endpoint name, a control character) gives
/// none, so it never reaches the database.
pub fn delivery_forms(endpoint: &str, given: &str) -> Vec<String> {
    if !Endpoint::valid_name(endpoint) || given.is_empty() || given.chars().any(char::is_control) {
        return Vec::new();
    }
    let mut forms = vec![bounded_delivery_id(given).into_owned()];
    if let Some(rest) = given
        .strip_prefix(endpoint)
        .and_then(|r| r.strip_prefix(':'))
        .filter(|r| !r.is_empty())
    {
        forms.push(bounded_delivery_id(rest).into_owned());
    }
    forms
}

/// One receipt, by its delivery id in any form [`delivery_forms`] accepts.
pub async fn find_receipt<S: WebhookStore>(
    store: &S,
    endpoint: &str,
    delivery: &str,
) -> Result<Option<Receipt>, StoreError> {
    for id in delivery_forms(endpoint, delivery) {
        if let Some(r) = store.get_receipt(endpoint, &id).await? {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// An operator's replay of a delivery named in any form [`delivery_forms`]
/// accepts; the stored delivery id (or `delivery` when none matched) and what
/// the replay did.
pub async fn replay_receipt<S: WebhookStore>(
    store: &S,
    endpoint: &str,
    delivery: &str,
    now_ms: i64,
) -> Result<(String, Requeue), StoreError> {
    for id in delivery_forms(endpoint, delivery) {
        match store.replay_receipt(endpoint, &id, now_ms).await? {
            Requeue::NotFound => {}
            outcome => return Ok((id, outcome)),
        }
    }
    Ok((delivery.to_owned(), Requeue::NotFound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_forms_accept_the_idempotency_key_form() {
        assert_eq!(delivery_forms("github", "4242:abc"), ["4242:abc"]);
        assert_eq!(
            delivery_forms("github", "github:4242:abc"),
            ["github:4242:abc", "4242:abc"],
            "as given first: an id may itself start with the endpoint's name"
        );
        assert_eq!(delivery_forms("github", "github:"), ["github:"]);
        let long = "x".repeat(300);
        let hashed = bounded_delivery_id(&long).into_owned();
        assert_eq!(
            delivery_forms("github", &long),
            std::slice::from_ref(&hashed)
        );
        assert_eq!(
            delivery_forms("github", &format!("github:{long}")),
            [
                bounded_delivery_id(&format!("github:{long}")).into_owned(),
                hashed
            ]
        );
        assert!(delivery_forms("github", "a\0b").is_empty());
        assert!(delivery_forms("git\0hub", "a").is_empty());
        assert!(delivery_forms("github", "").is_empty());
    }
}
