//! The checkout page (`/checkout`) in a real Chromium (`tests/browser/checkout.mjs`)
//! against the real shop on SQLite: a double click on Pay, two more submits
//! around the disabled button, a reload and a retry make ONE order, every
//! answer the page shows names it; a new cart (a new key) makes a second.

use crate::call;
use crate::checkout::{ShopDb, World, set_stock, stock};
use crate::console::browser;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkout_page_pays_once_per_cart_in_chromium() {
    let browser = browser();
    let w = World::new(ShopDb::sqlite().await).await;
    let shop = w.shop(&[], None).await;
    let a = shop.addr;
    set_stock(a, "tee-m", 10).await;

    // The page and its files are the binary's, under a CSP of this origin.
    for (path, kind) in [
        ("/checkout", "text/html"),
        ("/checkout/", "text/html"),
        ("/checkout/app.js", "text/javascript"),
        ("/checkout/app.css", "text/css"),
    ] {
        let r = call(a, "GET", path, None, "").await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
        let csp = r.header("content-security-policy").unwrap();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{csp}"
        );
    }
    let html = call(a, "GET", "/checkout", None, "").await;
    let html = String::from_utf8_lossy(&html.body);
    assert!(!html.contains("http://") && !html.contains("https://") && !html.contains("<script>"));

    let out = std::process::Command::new(&browser.node)
        .arg("checkout.mjs")
        .current_dir(&browser.dir)
        .env("IDEM_SHOP_URL", format!("http://{a}"))
        .env("IDEM_TEST_CHROMIUM", &browser.chromium)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "checkout.mjs failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "the cart has a v4 UUID key before Pay is clicked",
        "every answer names the same order",
        "the retry is shown as replayed",
        "the shop still holds exactly one order",
        "the new cart's Pay makes another order",
    ] {
        assert!(stdout.contains(&format!("ok - {check}")), "{check}");
    }
    let named = |label: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label}line"))
            .trim()
            .to_owned()
    };
    let (first, second) = (named("order-1 "), named("order-2 "));
    assert_ne!(first, second);

    // The shop's own file: the two carts' orders and nothing else, the first
    // of 2 × tee-m, confirmed.
    let pool = sqlx::SqlitePool::connect(&w.db.url()).await.unwrap();
    let orders: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT id, quantity, status FROM demo_orders ORDER BY created_at_ms")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        orders,
        vec![
            (first.clone(), 2, "confirmed".to_owned()),
            (second.clone(), 1, "confirmed".to_owned()),
        ]
    );
    assert_eq!(stock(a, "tee-m").await, (7, 0), "3 of 10 sold");
    // The provider charged each order once.
    let payments = w.payments().await;
    let mut references: Vec<&str> = payments.values().map(|(r, _, _)| r.as_str()).collect();
    references.sort_unstable();
    let mut expected = vec![first.as_str(), second.as_str()];
    expected.sort_unstable();
    assert_eq!(references, expected, "{payments:?}");
    assert_eq!(
        w.proxy
            .charges()
            .iter()
            .filter(|c| c.reference.as_deref() == Some(first.as_str()))
            .count(),
        1,
        "the first order was charged once"
    );
}
