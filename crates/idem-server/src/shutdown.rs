//! Shutdown: a watch that turns true on Ctrl-C or SIGTERM, and the future
//! every background task ends on.

use tokio::sync::watch;

/// A watch that turns true on Ctrl-C or SIGTERM.
pub fn on_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        #[cfg(unix)]
        let term = async {
            if let Ok(mut s) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                s.recv().await;
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! { _ = ctrl_c => {}, _ = term => {} }
        let _ = tx.send(true);
    });
    rx
}

/// Resolves when `shutdown` turns true.
pub async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}
