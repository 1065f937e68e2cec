//! `cargo xtask readme-app`: the README's library section taken literally.
//! A new project outside the workspace gets the README's `[dependencies]`
//! block (its `path` pointed at this clone) and, as `src/main.rs`, the
//! program the section sends the reader to: the code block of
//! docs/library.md marked as the axum-layer example (the README names that
//! page); its dependencies are resolved afresh (no lock file is
//! copied), it is built, started, and a retried request is checked to make
//! one order. `cargo xtask test` runs it as part of the whole suite.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::shell::{Beside, Result, cargo, run};

/// The section of README.md whose first `toml` block is the dependency line.
const SECTION: &str = "## Use it as a library";
/// The page, named in that section, whose marked block is the program.
const PROGRAM_PAGE: &str = "docs/library.md";
/// The marker of the code block that is the new project's `main.rs`.
const SNIPPET: &str = "<!-- example: examples/axum-layer/src/main.rs -->";
/// The path the README tells a user to depend on (a clone next to theirs).
const README_PATH: &str = "../idem/crates/idemkit";

/// `cargo xtask readme-app`.
pub(crate) fn run_cli(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        return Err(format!("readme-app takes no arguments, got {a:?}"));
    }
    let said = readme_app(&crate::shell::workspace_root())?;
    println!("readme app: {said}");
    Ok(())
}

/// Builds and runs the README's library example as a new project; says
/// what it checked.
pub(crate) fn readme_app(root: &Path) -> Result<String> {
    let (app, binary) = build(root, None)?;
    let checked = exercise(&binary, &app);
    let _ = std::fs::remove_dir_all(&app);
    checked
}

/// Builds the README's example as [`readme_app`] does, niced, beside the
/// tests, running nothing: [`readme_app`] then finds it built (its lock file
/// is made afresh again and gives the same versions unless one was published
/// in between).
pub(crate) fn prebuild(root: &Path, beside: &Beside<'_>) -> Result<()> {
    let (app, _) = build(root, Some(beside))?;
    let _ = std::fs::remove_dir_all(&app);
    Ok(())
}

/// Writes the new project and builds it; its directory and its binary.
fn build(root: &Path, background: Option<&Beside<'_>>) -> Result<(PathBuf, PathBuf)> {
    let readme = std::fs::read_to_string(root.join("README.md"))
        .map_err(|e| format!("cannot read README.md: {e}"))?;
    let page = std::fs::read_to_string(root.join(PROGRAM_PAGE))
        .map_err(|e| format!("cannot read {PROGRAM_PAGE}: {e}"))?;
    let (deps, main) = blocks(&readme, &page)?;
    let idemkit = root.join("crates/idemkit");
    if !deps.contains(README_PATH) {
        return Err(format!(
            "README.md's dependency block no longer names {README_PATH:?}: update xtask/src/readme_app.rs"
        ));
    }
    let deps = deps.replace(README_PATH, &idemkit.display().to_string());
    // Outside the workspace, so Cargo resolves it as a project of its own.
    let app = std::env::temp_dir().join("idem-readme-app");
    let _ = std::fs::remove_dir_all(&app);
    let write = |path: PathBuf, text: String| {
        std::fs::create_dir_all(path.parent().unwrap_or(&app))
            .and_then(|()| std::fs::write(&path, text))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write(
        app.join("Cargo.toml"),
        format!(
            "[package]\nname = \"readme-app\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n{deps}"
        ),
    )?;
    write(app.join("src/main.rs"), main)?;
    // A target directory of its own, kept between runs so a second run
    // compiles only what changed; the lock file is always fresh.
    let target = root.join("target/readme-app");
    let mut cmd = cargo(background.is_some());
    cmd.arg("build")
        .current_dir(&app)
        .env("CARGO_TARGET_DIR", &target);
    match background {
        Some(beside) => beside.run(&mut cmd)?,
        None => {
            eprintln!(
                "xtask: building README.md's library example as a new project in {}",
                app.display()
            );
            run(&mut cmd)?;
        }
    }
    Ok((app, target.join("debug/readme-app")))
}

/// The README's dependency block, and the `main.rs` block of the page its
/// library section sends the reader to.
fn blocks(readme: &str, page: &str) -> Result<(String, String)> {
    let at = readme
        .find(SECTION)
        .ok_or_else(|| format!("README.md has no section {SECTION:?}"))?;
    let section = &readme[at..];
    let section = section[SECTION.len()..]
        .find("\n## ")
        .map_or(section, |end| &section[..SECTION.len() + end]);
    let deps = fenced(section, "```toml\n")
        .ok_or_else(|| format!("README.md's {SECTION:?} has no toml block"))?;
    if !section.contains(PROGRAM_PAGE) {
        return Err(format!(
            "README.md's {SECTION:?} no longer names {PROGRAM_PAGE}: update xtask/src/readme_app.rs"
        ));
    }
    let snippet = page
        .find(SNIPPET)
        .ok_or_else(|| format!("{PROGRAM_PAGE} has no {SNIPPET}"))?;
    let main = fenced(&page[snippet..], "```rust\n")
        .ok_or_else(|| format!("{PROGRAM_PAGE} has no rust block after {SNIPPET}"))?;
    Ok((deps.to_owned(), main.to_owned()))
}

/// The text of the first block opened by `fence` in `text`.
fn fenced<'a>(text: &'a str, fence: &str) -> Option<&'a str> {
    let start = text.find(fence)? + fence.len();
    let len = text[start..].find("\n```")? + 1;
    Some(&text[start..start + len])
}

/// Starts the built example and checks the guarantee it shows.
fn exercise(binary: &Path, dir: &Path) -> Result<String> {
    let mut child = Command::new(binary)
        .env("IDEM_DB", dir.join("orders.db"))
        .env("IDEM_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let checked = address(&mut child).and_then(|addr| requests(&addr));
    let _ = child.kill();
    let _ = child.wait();
    checked
}

/// The address the example prints (`listening on ADDR`), within a minute.
fn address(child: &mut Child) -> Result<String> {
    let stdout = child.stdout.take().ok_or("the example's stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| "the example printed no address within 60 s".to_owned())?;
    line.trim()
        .strip_prefix("listening on ")
        .map(str::to_owned)
        .ok_or_else(|| format!("the example printed {line:?}, not `listening on ADDR`"))
}

/// A retried request is one order, replayed; another body under the key is
/// 422; another key is a second order.
fn requests(addr: &str) -> Result<String> {
    let acme = "Bearer key-acme";
    let first = post(addr, acme, "readme-1", "book")?;
    let retry = post(addr, acme, "readme-1", "book")?;
    let other = post(addr, acme, "readme-1", "lamp")?;
    let second = post(addr, acme, "readme-2", "pen")?;
    let ok = first.starts_with("http/1.1 201")
        && first.ends_with("order 1")
        && retry.starts_with("http/1.1 201")
        && retry.contains("idempotent-replayed: true")
        && retry.ends_with("order 1")
        && other.starts_with("http/1.1 422")
        && second.ends_with("order 2");
    if ok {
        Ok("fresh resolution; a retry replayed one order, another body 422".into())
    } else {
        Err(format!(
            "the example did not keep its promise:\n{first}\n---\n{retry}\n---\n{other}\n---\n{second}"
        ))
    }
}

/// One `POST /orders`; the whole answer, lower-cased.
fn post(addr: &str, auth: &str, key: &str, body: &str) -> Result<String> {
    let failed = |e: std::io::Error| format!("POST /orders to {addr}: {e}");
    let mut stream = TcpStream::connect(addr).map_err(failed)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(failed)?;
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\n\
         idempotency-key: {key}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(failed)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(failed)?;
    Ok(answer.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blocks_are_found_in_their_section() {
        let readme = "# x\n```toml\nnot = 1\n```\n## Use it as a library\ntext\n```toml\n[dependencies]\na = 1\n```\n\
                      the program: docs/library.md\n## Next\n```toml\nnot = 2\n```\n";
        let page = "# Library\n```rust\nfn other() {}\n```\n\
                    <!-- example: examples/axum-layer/src/main.rs -->\n```rust\nfn main() {}\n```\n";
        let (deps, main) = blocks(readme, page).unwrap();
        assert_eq!(deps, "[dependencies]\na = 1\n");
        assert_eq!(main, "fn main() {}\n");
        assert!(blocks("# no section\n", page).is_err());
        // The section must send the reader to the page, and the page must
        // hold the marked block.
        let unnamed = readme.replace("docs/library.md", "elsewhere");
        assert!(blocks(&unnamed, page).is_err());
        assert!(blocks(readme, "# Library\n").is_err());
    }
}
