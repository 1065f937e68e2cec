//! Starts the example and checks what it shows: the app's route, the admin
//! API behind its token, and a weak token refused at start.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

const TOKEN: &str = "k3V9q-ZpX2m7TfR8wLc4Hn6Yb1Ds5Ga0";

struct App(Child);

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn command(token: &str, db: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_example-admin-router"));
    c.env("IDEM_ADMIN_TOKEN", token)
        .env("IDEM_DB", db)
        .env("IDEM_LISTEN", "127.0.0.1:0");
    c
}

fn db_path(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("example-admin-router-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name).to_string_lossy().into_owned()
}

/// One request; the status line, headers and body as one string.
fn get(addr: &str, path: &str, auth: Option<&str>) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn app_route_and_admin_api_behind_the_token() {
    let mut child = command(TOKEN, &db_path("ok.db"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _app = App(child);
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();

    let hello = get(&addr, "/hello", None);
    assert!(hello.starts_with("HTTP/1.1 200"), "{hello}");
    assert!(hello.ends_with("hello from the app\n"), "{hello}");

    let anon = get(&addr, "/admin/v1/overview", None);
    assert!(anon.starts_with("HTTP/1.1 401"), "{anon}");
    assert!(
        anon.to_lowercase()
            .contains("content-type: application/problem+json"),
        "{anon}"
    );

    let authed = get(&addr, "/admin/v1/keys", Some(TOKEN));
    assert!(authed.starts_with("HTTP/1.1 200"), "{authed}");
    assert!(
        authed
            .to_lowercase()
            .contains("content-type: application/json"),
        "{authed}"
    );
}

#[test]
fn a_weak_token_is_refused_at_start() {
    let out = command("password", &db_path("weak.db")).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin token must be"), "{err}");
    assert!(out.stdout.is_empty(), "it must not listen");
}
