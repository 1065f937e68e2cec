//! Who a key belongs to: tenant and operation.

use std::fmt;

use crate::error::ScopeError;
use crate::idempotency_key::IdempotencyKey;

/// The longest tenant id or operation name accepted.
pub const NAME_MAX_LEN: usize = 128;

/// A tenant id. Keys of one tenant are never visible to another.
///
/// Valid tenants are 1 to 128 characters of `[A-Za-z0-9._:@-]`. A tenant must come
/// from an authenticated principal or a trusted, configured source, never blindly
/// from a client header.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

/// An operation name such as `payments.create`. Keys are scoped by operation so
/// that one key sent to two different operations never replays across them.
///
/// Valid operations are 1 to 128 characters of `[A-Za-z0-9._:/-]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Operation(String);

fn check(kind: &'static str, value: &str, extra: &[u8]) -> Result<(), ScopeError> {
    if value.is_empty() || value.len() > NAME_MAX_LEN {
        return Err(ScopeError::Length {
            kind,
            len: value.len(),
        });
    }
    if let Some(position) = value
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || extra.contains(&b)))
    {
        return Err(ScopeError::InvalidChar { kind, position });
    }
    Ok(())
}

impl Tenant {
    /// Validates a tenant id.
    pub fn new(value: impl Into<String>) -> Result<Self, ScopeError> {
        let value = value.into();
        check("tenant", &value, b"._:@-")?;
        Ok(Self(value))
    }

    /// The tenant id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Operation {
    /// Validates an operation name.
    pub fn new(value: impl Into<String>) -> Result<Self, ScopeError> {
        let value = value.into();
        check("operation", &value, b"._:/-")?;
        Ok(Self(value))
    }

    /// The operation name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The full identity of a key record: the primary key
/// `(tenant_id, operation, idempotency_key)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scope {
    /// Owner of the key.
    pub tenant: Tenant,
    /// The operation the key was sent to.
    pub operation: Operation,
    /// The client's key.
    pub key: IdempotencyKey,
}

impl Scope {
    /// Groups the three parts of a key record's identity.
    pub fn new(tenant: Tenant, operation: Operation, key: IdempotencyKey) -> Self {
        Self {
            tenant,
            operation,
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_and_operation_validation() {
        assert!(Tenant::new("acme-corp_1").is_ok());
        assert!(Tenant::new("").is_err());
        assert!(Tenant::new("a b").is_err());
        assert!(Tenant::new("x".repeat(129)).is_err());
        assert!(Operation::new("payments.create").is_ok());
        assert!(Operation::new("v1/payments/refunds").is_ok());
        assert!(matches!(
            Operation::new("pay ments"),
            Err(ScopeError::InvalidChar { position: 3, .. })
        ));
    }
}
