//! The ledger handler of the Kafka tests and of the drill example
//! (`examples/drill_consumer.rs` includes this file): one row per applied
//! message, in the inbox transaction.

use std::marker::PhantomData;

use idem_core::BoxFuture;
use idem_inbox::{Handler, HandlerError, InboxMessage};
use idem_sql::Dialect;
use idem_sql::dialect::{On, Stmt};

/// One ledger row per applied message; a payload starting `fail-once`
/// fails its first delivery (retryable).
pub struct Ledger<D>(PhantomData<D>);

impl<D> Default for Ledger<D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<D: Dialect> Handler<D::Tx> for Ledger<D> {
    fn handle<'a>(
        &'a self,
        tx: &'a mut D::Tx,
        m: &'a InboxMessage,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let payload = String::from_utf8_lossy(&m.payload).into_owned();
            if payload.starts_with("fail-once") && m.delivered == 1 {
                return Err(HandlerError::Retry("payload says fail once".into()));
            }
            let s =
                Stmt::new("INSERT INTO ledger (message_id, msg_key, payload) VALUES ($1, $2, $3)")
                    .bind(m.message_id.as_str())
                    .bind(m.key.clone().unwrap_or_default())
                    .bind(payload);
            D::execute(On::Conn(&mut **tx), s)
                .await
                .map_err(|e| HandlerError::Retry(e.into()))?;
            Ok(())
        })
    }
}
