//! The lease as the executor and its heartbeat share it: the heartbeat
//! renews it, every external call checks it first, and [`guarded`] work
//! stops the moment it is lost.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use idem_core::Clock;
use idem_core::steps::{Lease, RunChange, RunStore};
use tokio::sync::watch;

use crate::error::Stop;
use crate::executor::Executor;

/// The lease as the executor and its heartbeat share it.
#[derive(Debug)]
pub(super) struct Beat {
    pub(super) locked_until_ms: AtomicI64,
    /// Off while the run's first transaction (its key's claim) is open: the
    /// run is not visible to a heartbeat before it commits.
    pub(super) active: AtomicBool,
}

/// Runs `fut` unless the lease is lost first.
pub(super) async fn guarded<T>(
    lost: &mut watch::Receiver<bool>,
    fut: impl Future<Output = T>,
) -> Result<T, Stop> {
    if *lost.borrow() {
        return Err(Stop::LeaseLost);
    }
    let lost_now = async {
        if lost.wait_for(|l| *l).await.is_err() {
            // The heartbeat is gone with the drive: never lost from here.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        v = fut => Ok(v),
        () = lost_now => Err(Stop::LeaseLost),
    }
}

/// Renews the lease every third of it while the run executes; says so when
/// it is lost (fenced out, or not renewed before it ended).
pub(super) async fn heartbeat<S: RunStore>(
    exec: Arc<Executor<S>>,
    lease: Lease,
    beat: Arc<Beat>,
    lost: watch::Sender<bool>,
) {
    let every = exec.config.lease / 3;
    loop {
        tokio::time::sleep(every).await;
        if !beat.active.load(Ordering::SeqCst) {
            continue;
        }
        let now = exec.clock.now_ms();
        let until = now + exec.lease_ms();
        let change = RunChange {
            locked_until_ms: Some(until),
            ..RunChange::default()
        };
        match exec.store.record_run(&lease, &change, None, now).await {
            Ok(true) => beat.locked_until_ms.store(until, Ordering::SeqCst),
            Ok(false) => {
                crate::metrics::fence_rejected();
                tracing::warn!(run = %lease.run, fence = %lease.fence, "heartbeat fenced out: another executor took the run over");
                let _ = lost.send(true);
                return;
            }
            Err(e) => {
                if exec.clock.now_ms() >= beat.locked_until_ms.load(Ordering::SeqCst) {
                    tracing::warn!(run = %lease.run, error = %idem_core::ErrorChain(&e), "lease not renewed in time; stopping");
                    let _ = lost.send(true);
                    return;
                }
                tracing::debug!(run = %lease.run, error = %idem_core::ErrorChain(&e), "heartbeat failed; retrying");
            }
        }
    }
}
