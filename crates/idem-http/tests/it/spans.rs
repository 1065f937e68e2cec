//! The layer's `idem.request` span: the operation, the tenant and a short
//! hash of the key around everything the handler logs — never the key.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use axum::routing::post;
use idem_core::{Operation, Tenant};
use idem_http::{IdempotencyLayer, RouteConfig, TenantSource};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn the_request_span_has_tenant_operation_and_key_hash_never_the_key() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let db = super::sqlite_db::setup().await;
    let config = RouteConfig::required(
        Operation::new("payments.create").unwrap(),
        TenantSource::TrustedHeader {
            name: axum::http::HeaderName::from_static("x-tenant-id"),
            default: Tenant::new("default").ok(),
        },
    );
    let app = axum::Router::new().route(
        "/payments",
        post(|| async {
            tracing::info!("inside the handler");
            StatusCode::CREATED
        })
        .layer(IdempotencyLayer::new(db.store.clone(), config)),
    );
    let key = "secret-client-key-42";
    let (status, _, _) = super::send(&app, Some(key), "tenant-a", "{}").await;
    assert_eq!(status, StatusCode::CREATED);

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("inside the handler"))
        .unwrap_or_else(|| panic!("no handler line in {text}"));
    assert!(line.contains("idem.request{"), "{line}");
    assert!(line.contains("operation=payments.create"), "{line}");
    assert!(line.contains("tenant=tenant-a"), "{line}");
    let hash = idem_core::short_hash(key.as_bytes());
    assert_eq!(hash.len(), 12);
    assert!(line.contains(&format!("key_hash={hash}")), "{line}");
    assert!(!text.contains(key), "the raw key was logged: {text}");
}
