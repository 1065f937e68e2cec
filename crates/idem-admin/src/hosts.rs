//! The `Host` allow-list of the admin routes, the console and a guarded
//! `/metrics`, against DNS rebinding: a page of `evil.example` whose name
//! now resolves to this server sends `Host: evil.example`, and is refused.
//!
//! A request's host (its `Host` header, or the authority of an
//! absolute-form request target, which wins) is allowed when it is
//!
//! - an IP literal (`127.0.0.1:8080`, `[::1]:8080`, `10.0.0.5`), on any port:
//!   a rebinding page cannot send one, since its own origin would then be
//!   that address, i.e. this server's; and port-mapped or tunnelled access
//!   (`docker -p`, `ssh -L`) keeps working;
//! - `localhost`, on any port, for the same reason;
//! - a name configured in [`AllowedHosts`] (`admin.example.com` on any
//!   port, or `admin.example.com:8443` on that port alone; `idem serve`
//!   takes them as `--admin-hosts`).
//!
//! Names compare case-insensitively, without a final dot. A request without
//! a host, with two, or with one that is not a host name is refused. Then an
//! `Origin`, if sent, must be `http(s)://` + that allowed host
//! (`host_or_origin_refusal`).

use std::net::{IpAddr, Ipv6Addr};

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::Response;

/// The most names an [`AllowedHosts`] holds.
pub const MAX_HOSTS: usize = 64;

/// A configured name, lowercase, and its port when one was given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    port: Option<u16>,
}

/// The allowed hosts: IP literals and `localhost` always, and the
/// configured names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    names: Vec<Entry>,
}

/// A request host, parsed.
#[derive(Debug, PartialEq, Eq)]
enum Host {
    Ip,
    Name(String, Option<u16>),
}

/// Why a request's host is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No host, two, or not a host.
    Invalid,
    /// A host name not on the list.
    NotAllowed,
}

fn valid_name(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Parses `host[:port]` (a host name, an IPv4 address, or an IPv6 address
/// in brackets).
fn parse(text: &str) -> Option<Host> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        return match port {
            Some(p) => port_number(p).map(|_| Host::Ip),
            None => Some(Host::Ip),
        };
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(port_number(p)?)),
            None => (text, None),
        }
    };
    if host.parse::<IpAddr>().is_ok() {
        return Some(Host::Ip);
    }
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    valid_name(&name).then_some(Host::Name(name, port))
}

fn port_number(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

impl AllowedHosts {
    /// A list of names, or `name:port`, separated by commas (spaces around
    /// them ignored); empty for none. The errors name no flag (the caller
    /// says where the list came from).
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut names = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || {
                format!(
                    "{item:?} is not a host name or NAME:PORT \
                     (e.g. admin.example.com or admin.example.com:8443)"
                )
            };
            match parse(item).ok_or_else(bad)? {
                Host::Ip => {} // always allowed
                Host::Name(name, port) => names.push(Entry { name, port }),
            }
        }
        if names.len() > MAX_HOSTS {
            return Err(format!(
                "at most {MAX_HOSTS} host names, got {}",
                names.len()
            ));
        }
        Ok(Self { names })
    }

    /// Whether no name is configured.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether `host` (as in a `Host` header) is allowed.
    fn allows(&self, host: &str) -> Result<(), Refused> {
        match parse(host).ok_or(Refused::Invalid)? {
            Host::Ip => Ok(()),
            Host::Name(name, _) if name == "localhost" => Ok(()),
            Host::Name(name, port) => {
                let listed = self
                    .names
                    .iter()
                    .any(|e| e.name == name && e.port.is_none_or(|p| Some(p) == port));
                if listed {
                    Ok(())
                } else {
                    Err(Refused::NotAllowed)
                }
            }
        }
    }

    /// The request's host, if allowed: the authority of an absolute-form
    /// target, else the one `Host` header.
    pub fn check<'a>(&self, uri: &'a Uri, headers: &'a HeaderMap) -> Result<&'a str, Refused> {
        let host = request_host(uri, headers).ok_or(Refused::Invalid)?;
        self.allows(host).map(|()| host)
    }
}

/// The host a request is for: the authority of an absolute-form target
/// (RFC 9112 §3.2.2), else its one `Host` header.
pub fn request_host<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    if let Some(authority) = uri.authority() {
        // No credentials in a host.
        return (!authority.as_str().contains('@')).then_some(authority.as_str());
    }
    let mut values = headers.get_all(header::HOST).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    value.to_str().ok()
}

/// The refusal of a request naming a host not allowed (`421
/// host-not-allowed`; `400 invalid-host` without a valid one) or sent by a
/// page of another origin (`403 foreign-origin`).
pub(crate) fn host_or_origin_refusal(hosts: &AllowedHosts, req: &Request) -> Option<Response> {
    let host = match hosts.check(req.uri(), req.headers()) {
        Ok(host) => host,
        Err(Refused::Invalid) => {
            return Some(idem_http::problem(
                StatusCode::BAD_REQUEST,
                "invalid-host",
                "The request needs one valid Host",
                Some("send one Host header naming this server"),
                None,
            ));
        }
        Err(Refused::NotAllowed) => {
            return Some(idem_http::problem(
                StatusCode::MISDIRECTED_REQUEST,
                "host-not-allowed",
                "This server does not answer admin requests for that host",
                Some(
                    "reach it by IP address or localhost, or add the name to this server's \
                      allowed admin hosts",
                ),
                None,
            ));
        }
    };
    if foreign_origin(req.headers(), host) {
        return Some(idem_http::problem(
            StatusCode::FORBIDDEN,
            "foreign-origin",
            "Admin requests from another origin are refused",
            Some("the Origin header names a site other than this server"),
            None,
        ));
    }
    None
}

/// Whether the request carries an `Origin` that is not this server's own
/// (`http(s)://<host>`, `host` being the request's allowed host). Requests
/// without `Origin` (curl, the CLI) pass; browsers send it on cross-origin
/// requests and on every POST.
fn foreign_origin(headers: &HeaderMap, host: &str) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let mut origins = headers.get_all(header::ORIGIN).iter();
    if origins.nth(1).is_some() {
        return true;
    }
    let Ok(origin) = origin.to_str() else {
        return true;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority.is_none_or(|a| !a.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, hosts: &[&str]) -> (Uri, HeaderMap) {
        let mut h = HeaderMap::new();
        for v in hosts {
            h.append(header::HOST, v.parse().unwrap());
        }
        (uri.parse().unwrap(), h)
    }

    #[test]
    fn ip_literals_and_localhost_are_always_allowed() {
        let none = AllowedHosts::default();
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "10.1.2.3:18080",
            "[::1]:8080",
            "[::1]",
            "[2001:db8::1]:443",
            "localhost:8080",
            "LOCALHOST:9",
            "localhost.:8080",
            "localhost",
        ] {
            assert_eq!(none.allows(host), Ok(()), "{host}");
        }
    }

    #[test]
    fn other_names_only_when_configured() {
        let none = AllowedHosts::default();
        assert_eq!(none.allows("evil.example:8080"), Err(Refused::NotAllowed));
        assert_eq!(none.allows("evil.example"), Err(Refused::NotAllowed));
        assert_eq!(
            none.allows("localhost.evil.example"),
            Err(Refused::NotAllowed)
        );
        assert_eq!(none.allows("sub.localhost"), Err(Refused::NotAllowed));
        let some = AllowedHosts::parse(" Admin.Example.com , ops.example:8443,,127.0.0.1").unwrap();
        assert_eq!(some.allows("admin.example.com"), Ok(()));
        assert_eq!(some.allows("ADMIN.example.COM:8080"), Ok(()), "any port");
        assert_eq!(some.allows("admin.example.com.:443"), Ok(()), "final dot");
        assert_eq!(some.allows("ops.example:8443"), Ok(()));
        assert_eq!(some.allows("ops.example:8080"), Err(Refused::NotAllowed));
        assert_eq!(some.allows("ops.example"), Err(Refused::NotAllowed));
        assert_eq!(some.allows("evil.example"), Err(Refused::NotAllowed));
        assert_eq!(some.allows("xadmin.example.com"), Err(Refused::NotAllowed));
    }

    #[test]
    fn malformed_hosts_are_invalid() {
        let none = AllowedHosts::default();
        for host in [
            "",
            "localhost:",
            "localhost:99999",
            "localhost:80a",
            "a b",
            "user@localhost",
            "[::1",
            "[::1]x",
            "[nothex]:80",
            "::1",
            "http://localhost",
            "localhost/x",
        ] {
            assert_eq!(none.allows(host), Err(Refused::Invalid), "{host:?}");
        }
    }

    #[test]
    fn the_host_is_the_one_header_or_the_absolute_target() {
        let none = AllowedHosts::default();
        let (u, h) = req("/admin", &["localhost:8080"]);
        assert_eq!(none.check(&u, &h), Ok("localhost:8080"));
        let (u, h) = req("/admin", &[]);
        assert_eq!(none.check(&u, &h), Err(Refused::Invalid), "missing");
        let (u, h) = req("/admin", &["localhost", "localhost"]);
        assert_eq!(none.check(&u, &h), Err(Refused::Invalid), "twice");
        let (u, h) = req("http://evil.example/admin", &["localhost"]);
        assert_eq!(
            none.check(&u, &h),
            Err(Refused::NotAllowed),
            "the target's authority wins"
        );
        let (u, h) = req("http://127.0.0.1:8080/admin", &["evil.example"]);
        assert_eq!(none.check(&u, &h), Ok("127.0.0.1:8080"));
    }

    #[test]
    fn the_list_is_checked() {
        assert!(AllowedHosts::parse("").unwrap().names.is_empty());
        assert!(AllowedHosts::parse("https://admin.example").is_err());
        assert!(AllowedHosts::parse("admin.example/x").is_err());
        assert!(AllowedHosts::parse("admin.example:0x1").is_err());
        let many = (0..=MAX_HOSTS)
            .map(|i| format!("h{i}.example"))
            .collect::<Vec<_>>();
        assert!(AllowedHosts::parse(&many.join(",")).is_err());
    }

    #[test]
    fn origins() {
        let h = |origin: &[&str], host: &str| {
            let mut m = HeaderMap::new();
            for o in origin {
                m.append(header::ORIGIN, o.parse().unwrap());
            }
            foreign_origin(&m, host)
        };
        assert!(!h(&[], "127.0.0.1:8080"), "no Origin: curl, the CLI");
        assert!(!h(&["http://127.0.0.1:8080"], "127.0.0.1:8080"));
        assert!(!h(&["https://Admin.Example"], "admin.example"));
        assert!(h(&["http://evil.example"], "127.0.0.1:8080"));
        assert!(h(&["null"], "127.0.0.1:8080"));
        assert!(h(&["http://127.0.0.1:8081"], "127.0.0.1:8080"));
        assert!(h(
            &["http://127.0.0.1:8080", "http://127.0.0.1:8080"],
            "127.0.0.1:8080"
        ));
    }

    #[test]
    fn a_rebinding_page_is_refused_even_when_its_origin_is_its_host() {
        let run = |host: &str, origin: Option<&str>| {
            let mut b = Request::builder()
                .uri("/admin/v1/keys")
                .header(header::HOST, host);
            if let Some(o) = origin {
                b = b.header(header::ORIGIN, o);
            }
            let req = b.body(axum::body::Body::empty()).unwrap();
            host_or_origin_refusal(&AllowedHosts::default(), &req).map(|r| r.status().as_u16())
        };
        assert_eq!(
            run("evil.example:8080", Some("http://evil.example:8080")),
            Some(421)
        );
        assert_eq!(run("evil.example:8080", None), Some(421));
        assert_eq!(run("127.0.0.1:8080", Some("http://127.0.0.1:8080")), None);
        assert_eq!(run("localhost:8080", Some("http://localhost:8080")), None);
        assert_eq!(
            run("localhost:8080", Some("http://evil.example:8080")),
            Some(403)
        );
        assert_eq!(run("a b", None), Some(400));
    }
}
