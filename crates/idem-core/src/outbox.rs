//! The outbox: messages written in the business transaction, the
//! [`OutboxStore`] capability a dispatcher claims them through, the
//! [`OutboxWriter`] that writes them in the caller's transaction, and the
//! [`Wake`] hint that there is new work.

use std::fmt;
use std::future::Future;

use crate::error::StoreError;

/// Why a message part was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// A name or id is empty or too long.
    #[error("{kind} must be 1 to {max} bytes, got {len}")]
    Length {
        /// What was checked.
        kind: &'static str,
        /// The limit.
        max: usize,
        /// What was given.
        len: usize,
    },
    /// A character that is not allowed.
    #[error("{kind} has a character that is not allowed at byte {position}")]
    InvalidChar {
        /// What was checked.
        kind: &'static str,
        /// Byte offset of the first bad character.
        position: usize,
    },
    /// A topic with an empty token (`a..b`, `.a`, `a.`).
    #[error("topic {0:?} has an empty token")]
    EmptyToken(String),
    /// The payload is over [`OutboxMessage::MAX_PAYLOAD_BYTES`].
    #[error("payload is {len} bytes, the maximum is {max}")]
    PayloadTooLarge {
        /// The payload's size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More headers than [`OutboxMessage::MAX_HEADERS`].
    #[error("more than {max} headers")]
    TooManyHeaders {
        /// The limit.
        max: usize,
    },
    /// A header name the transport sets on every message itself (see
    /// [`OutboxMessage::header_except`]).
    #[error("header {0} is reserved")]
    ReservedHeader(String),
}

pub(crate) fn check(
    kind: &'static str,
    value: &str,
    max: usize,
    ok: impl Fn(u8) -> bool,
) -> Result<(), MessageError> {
    if value.is_empty() || value.len() > max {
        return Err(MessageError::Length {
            kind,
            max,
            len: value.len(),
        });
    }
    match value.bytes().position(|b| !ok(b)) {
        Some(position) => Err(MessageError::InvalidChar { kind, position }),
        None => Ok(()),
    }
}

pub(crate) fn visible_ascii(b: u8) -> bool {
    (0x21..=0x7e).contains(&b)
}

/// A message's stable id: generated once when the message is written to the
/// outbox, sent as the broker's deduplication id and used by every inbox to
/// drop duplicates.
/// 1 to 128 visible ASCII characters.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// The longest id accepted.
    pub const MAX_LEN: usize = 128;

    /// Validates an id received from elsewhere.
    pub fn new(value: impl Into<String>) -> Result<Self, MessageError> {
        let value = value.into();
        check("message id", &value, Self::MAX_LEN, visible_ascii)?;
        Ok(Self(value))
    }

    /// A new random id (UUID v4 in simple form, 32 hex digits).
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MessageId").field(&self.0).finish()
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a message is published: dot-separated tokens of `[A-Za-z0-9_-]`
/// (a NATS subject without wildcards), 1 to 255 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Topic(String);

impl Topic {
    /// Validates a topic.
    pub fn new(value: impl Into<String>) -> Result<Self, MessageError> {
        let value = value.into();
        check("topic", &value, 255, |b| {
            b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
        })?;
        if value.split('.').any(str::is_empty) {
            return Err(MessageError::EmptyToken(value));
        }
        Ok(Self(value))
    }

    /// The topic as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A message to write to the outbox, in the caller's transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Stable id, generated at write time.
    pub message_id: MessageId,
    /// Where it is published.
    pub topic: Topic,
    /// Ordering key (an aggregate id): messages with one key are published in
    /// the order they were written.
    pub key: String,
    /// The bytes to publish.
    pub payload: Vec<u8>,
    /// Extra headers, published as given.
    pub headers: Vec<(String, String)>,
    /// Not published before this time (unix ms); `None` is "now".
    pub available_at_ms: Option<i64>,
}

impl OutboxMessage {
    /// Largest payload accepted (the broker's default maximum).
    pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
    /// Most headers accepted.
    pub const MAX_HEADERS: usize = 32;
    /// Longest ordering key accepted.
    pub const MAX_KEY_LEN: usize = 255;

    /// A message with a new id.
    pub fn new(
        topic: Topic,
        key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Result<Self, MessageError> {
        let key = key.into();
        check("message key", &key, Self::MAX_KEY_LEN, |b| {
            b != b'\r' && b != b'\n'
        })?;
        let payload = payload.into();
        if payload.len() > Self::MAX_PAYLOAD_BYTES {
            return Err(MessageError::PayloadTooLarge {
                len: payload.len(),
                max: Self::MAX_PAYLOAD_BYTES,
            });
        }
        Ok(Self {
            message_id: MessageId::generate(),
            topic,
            key,
            payload,
            headers: Vec::new(),
            available_at_ms: None,
        })
    }

    /// Adds a header. Names are tokens of visible ASCII without `:`; values
    /// are printable ASCII or UTF-8 without line breaks.
    ///
    /// The core knows no transport, so this refuses no name; a transport sets
    /// some headers itself (the message id, the ordering key) and lists them
    /// for [`OutboxMessage::header_except`].
    pub fn header(self, name: &str, value: &str) -> Result<Self, MessageError> {
        self.header_except(name, value, &[])
    }

    /// Adds a header as [`OutboxMessage::header`] does, and refuses the names
    /// in `reserved` (compared without ASCII case) with
    /// [`MessageError::ReservedHeader`]: the headers a transport sets on every
    /// message itself, such as `idem_nats::RESERVED_HEADERS`.
    pub fn header_except(
        mut self,
        name: &str,
        value: &str,
        reserved: &[&str],
    ) -> Result<Self, MessageError> {
        check("header name", name, 128, |b| visible_ascii(b) && b != b':')?;
        if reserved.iter().any(|r| r.eq_ignore_ascii_case(name)) {
            return Err(MessageError::ReservedHeader(name.to_owned()));
        }
        if let Some(position) = value.bytes().position(|b| b == b'\r' || b == b'\n') {
            return Err(MessageError::InvalidChar {
                kind: "header value",
                position,
            });
        }
        if self.headers.len() >= Self::MAX_HEADERS {
            return Err(MessageError::TooManyHeaders {
                max: Self::MAX_HEADERS,
            });
        }
        self.headers.push((name.to_owned(), value.to_owned()));
        Ok(self)
    }

    /// Holds the message back until `at_ms` (unix ms).
    pub fn available_at_ms(mut self, at_ms: i64) -> Self {
        self.available_at_ms = Some(at_ms);
        self
    }
}

/// A message as claimed from the outbox by a dispatcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRecord {
    /// The outbox row id; increases in write order.
    pub id: i64,
    /// Stable id.
    pub message_id: MessageId,
    /// Where it is published.
    pub topic: Topic,
    /// Ordering key.
    pub key: String,
    /// The bytes to publish.
    pub payload: Vec<u8>,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Failed publish attempts so far.
    pub attempts: u32,
    /// When it was written (unix ms).
    pub created_at_ms: i64,
}

/// An outbox row's columns as read from any backend, before validation.
#[derive(Clone, Debug, Default)]
pub struct OutboxColumns {
    /// `id`.
    pub id: i64,
    /// `message_id`.
    pub message_id: String,
    /// `topic`.
    pub topic: String,
    /// `message_key`.
    pub message_key: String,
    /// `payload`.
    pub payload: Vec<u8>,
    /// `headers` (JSON list of pairs).
    pub headers: String,
    /// `attempts`.
    pub attempts: i64,
    /// `created_at_ms`.
    pub created_at_ms: i64,
}

impl OutboxColumns {
    /// Validates the columns into a record; the error names the bad column.
    pub fn decode(self) -> Result<OutboxRecord, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt { detail };
        Ok(OutboxRecord {
            id: self.id,
            message_id: MessageId::new(self.message_id)
                .map_err(|e| corrupt(format!("outbox {}: {e}", self.id)))?,
            topic: Topic::new(self.topic)
                .map_err(|e| corrupt(format!("outbox {}: {e}", self.id)))?,
            key: self.message_key,
            payload: self.payload,
            headers: crate::headers::from_json(&self.headers).ok_or_else(|| {
                corrupt(format!(
                    "outbox {}: headers are not a JSON list of pairs",
                    self.id
                ))
            })?,
            attempts: u32::try_from(self.attempts)
                .map_err(|_| corrupt(format!("outbox {}: attempts {}", self.id, self.attempts)))?,
            created_at_ms: self.created_at_ms,
        })
    }
}

/// Lag figures of an outbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Messages not yet published (including those backing off).
    pub pending: u64,
    /// When the oldest pending message was written (unix ms).
    pub oldest_pending_ms: Option<i64>,
    /// Messages that exhausted their attempts.
    pub dead: u64,
}

/// The outbox table, as a dispatcher uses it. Messages are written with the
/// backend's own `enqueue` function inside the caller's transaction; this trait
/// is the relay's side.
///
/// Implementations must claim with a lease so a crashed dispatcher's messages
/// come back, never hand out a message while an earlier one with the same key
/// is still pending (unsent or backing off), and let several dispatchers claim
/// at once without handing one message to two of them within a lease.
pub trait OutboxStore: Clone + Send + Sync + 'static {
    /// Leases up to `limit` publishable messages until `now_ms + lease`: pending,
    /// available, not leased, and first of their key among pending ones.
    /// Ordered by id.
    fn claim_batch(
        &self,
        now_ms: i64,
        lease: std::time::Duration,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<OutboxRecord>, StoreError>> + Send;

    /// Marks messages the broker acknowledged as sent. Returns how many were
    /// still pending.
    fn mark_sent(
        &self,
        ids: &[i64],
        now_ms: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Records a failed attempt: the message is retried at `retry_at_ms`, or
    /// becomes dead when `dead`.
    fn mark_failed(
        &self,
        id: i64,
        error: &str,
        retry_at_ms: i64,
        dead: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives messages back without counting an attempt (the broker was
    /// unreachable, not the message at fault); available again at `retry_at_ms`.
    fn release(
        &self,
        ids: &[i64],
        retry_at_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes at most `limit` messages sent at or before `before_ms`.
    fn purge_sent(
        &self,
        before_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Pending count, oldest pending message, dead count.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, StoreError>> + Send;
}

/// Writes outbox messages in the caller's transaction: the write side, as
/// `idem_outbox::Outbox` uses it. Backends implement it with their
/// low-level `outbox::enqueue` function; applications use it through
/// `Outbox`, which brings the clock.
pub trait OutboxWriter: crate::keys::KeyStore {
    /// Writes `message` in `tx`, created at `now_ms` (available then, unless
    /// the message says later). It is published only if `tx` commits.
    /// Returns the message's outbox id.
    ///
    /// # Cancel safety
    /// Cancelling leaves `tx` in an unknown state: roll it back (or drop it).
    fn enqueue(
        &self,
        tx: &mut Self::Tx,
        message: &OutboxMessage,
        now_ms: i64,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send;
}

/// A hint that there may be new work (new outbox messages), so a loop can sleep
/// until either the hint or its polling interval. Hints may be missed; polling
/// is what always works.
pub trait Wake: Send {
    /// Returns when a hint arrives or `max` has passed.
    ///
    /// # Cancel safety
    /// Implementations must be cancel safe.
    fn wait(&mut self, max: std::time::Duration) -> impl Future<Output = ()> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_subject_tokens() {
        assert!(Topic::new("payments.created").is_ok());
        assert!(Topic::new("a-b_c.D9").is_ok());
        for bad in ["", "payments.*", "payments.>", "a b", "a..b", ".a", "a."] {
            assert!(Topic::new(bad).is_err(), "{bad:?}");
        }
        assert!(Topic::new("x".repeat(256)).is_err());
    }

    #[test]
    fn message_ids() {
        let id = MessageId::generate();
        assert_eq!(id.as_str().len(), 32);
        assert_ne!(id, MessageId::generate());
        assert_eq!(MessageId::new(id.as_str()).unwrap(), id);
        assert!(MessageId::new("").is_err());
        assert!(MessageId::new("a b").is_err());
        assert!(MessageId::new("x".repeat(129)).is_err());
    }

    #[test]
    fn messages_validate_key_payload_and_headers() {
        let t = Topic::new("t").unwrap();
        let m = OutboxMessage::new(t.clone(), "pay_1", b"{}".to_vec()).unwrap();
        assert_eq!(m.key, "pay_1");
        assert!(OutboxMessage::new(t.clone(), "", b"".to_vec()).is_err());
        assert!(OutboxMessage::new(t.clone(), "a\nb", b"".to_vec()).is_err());
        let big = vec![0u8; OutboxMessage::MAX_PAYLOAD_BYTES + 1];
        assert!(matches!(
            OutboxMessage::new(t.clone(), "k", big),
            Err(MessageError::PayloadTooLarge { .. })
        ));
        let m = m.header("trace-id", "abc").unwrap();
        assert_eq!(m.headers, vec![("trace-id".into(), "abc".into())]);
        let reserved = &["Transport-Id"];
        assert!(matches!(
            m.clone().header_except("transport-ID", "x", reserved),
            Err(MessageError::ReservedHeader(_))
        ));
        assert!(m.clone().header_except("trace-id", "x", reserved).is_ok());
        assert!(m.clone().header_except("bad:name", "x", reserved).is_err());
        assert!(m.clone().header("bad:name", "x").is_err());
        assert!(m.clone().header("h", "line\r\nbreak").is_err());
        let mut many = OutboxMessage::new(t, "k", vec![]).unwrap();
        for i in 0..OutboxMessage::MAX_HEADERS {
            many = many.header(&format!("h{i}"), "v").unwrap();
        }
        assert!(matches!(
            many.header("one-more", "v"),
            Err(MessageError::TooManyHeaders { .. })
        ));
    }

    #[test]
    fn outbox_columns_decode_or_name_the_bad_one() {
        let good = OutboxColumns {
            id: 7,
            message_id: "m1".into(),
            topic: "payments.created".into(),
            message_key: "pay_1".into(),
            payload: b"{}".to_vec(),
            headers: r#"[["a","b"]]"#.into(),
            attempts: 2,
            created_at_ms: 5,
        };
        let r = good.clone().decode().unwrap();
        assert_eq!((r.id, r.attempts, r.headers.len()), (7, 2, 1));
        let bad = |c: OutboxColumns| c.decode().unwrap_err().to_string();
        assert!(
            bad(OutboxColumns {
                topic: "a..b".into(),
                ..good.clone()
            })
            .contains("empty token")
        );
        assert!(
            bad(OutboxColumns {
                message_id: "".into(),
                ..good.clone()
            })
            .contains("message id")
        );
        assert!(
            bad(OutboxColumns {
                headers: "{".into(),
                ..good.clone()
            })
            .contains("headers")
        );
        assert!(
            bad(OutboxColumns {
                attempts: -1,
                ..good
            })
            .contains("attempts")
        );
    }
}
