//! The consumer of payment events.

use std::marker::PhantomData;

use idem_core::BoxFuture;
use idem_inbox::{Handler, HandlerError, InboxMessage};

use crate::events::{Event, decode_event};
use crate::input::now_ms;
use crate::sql::{DemoSql, LedgerEntry};

/// A ledger entry per event and a receipt per payment, in the inbox
/// transaction.
pub struct Ledger<S>(PhantomData<fn() -> S>);

impl<S> Ledger<S> {
    /// The ledger on the store `S`.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<S> Default for Ledger<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: DemoSql> Handler<S::Tx> for Ledger<S> {
    fn handle<'a>(
        &'a self,
        tx: &'a mut S::Tx,
        m: &'a InboxMessage,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let event = decode_event(&m.subject, &m.payload).map_err(HandlerError::Reject)?;
            let (tenant, payment_id, kind, amount) = match &event {
                Event::Created {
                    tenant,
                    payment_id,
                    amount,
                } => (tenant, payment_id, "charge", *amount),
                Event::Refunded {
                    tenant,
                    payment_id,
                    amount,
                } => (tenant, payment_id, "refund", -*amount),
            };
            let entry = LedgerEntry {
                tenant,
                payment_id,
                kind,
                amount,
                message_id: m.message_id.as_str(),
                stream_sequence: m.stream_sequence as i64,
                now_ms: now_ms(),
                receipt: matches!(event, Event::Created { .. }),
            };
            S::record_entry(tx, &entry)
                .await
                .map_err(|e| HandlerError::Retry(e.into()))
        })
    }
}
