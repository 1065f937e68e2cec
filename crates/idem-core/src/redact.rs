//! Broker URLs as logs may show them.

/// A broker URL for a log line: a user and password (or token) before a
/// host's `@` are replaced by `[redacted]`.
pub fn without_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    // Only NATS takes a list; elsewhere a comma may be in the password.
    if !matches!(scheme, "nats" | "tls" | "") {
        // Everything up to the last `@` before the query: a password with
        // an unencoded `/` puts its `@` after what parses as the host.
        let end = rest.find(['?', '#']).unwrap_or(rest.len());
        return match rest[..end].rfind('@') {
            Some(at) => format!("{scheme}://[redacted]@{}", &rest[at + 1..]),
            None => format!("{scheme}://{rest}"),
        };
    }
    let servers: Vec<String> = rest
        .split(',')
        .map(|server| match server.rsplit_once('@') {
            Some((_, host)) => format!("[redacted]@{host}"),
            None => server.to_owned(),
        })
        .collect();
    let servers = servers.join(",");
    if scheme.is_empty() {
        servers
    } else {
        format!("{scheme}://{servers}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_never_reach_the_log() {
        let shown = |u| super::without_credentials(u);
        assert_eq!(
            shown("nats://user:hunter2@127.0.0.1:4222"),
            "nats://[redacted]@127.0.0.1:4222"
        );
        assert_eq!(shown("tls://tok@a:1,b:2"), "tls://[redacted]@a:1,b:2");
        assert_eq!(shown("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            shown("amqp://guest:hunter2@rabbit:5672/%2f"),
            "amqp://[redacted]@rabbit:5672/%2f"
        );
    }

    /// An amqp:// URL is one server: a `,` in its user or password (which
    /// `check_url` accepts, and `idem consume` logs at every retry) is not
    /// a server list.
    #[test]
    fn a_comma_in_an_amqp_password_does_not_reach_the_log() {
        let shown = super::without_credentials("amqp://guest:sec,ret@rabbit:5672/%2f");
        assert!(!shown.contains("sec"), "{shown}");
        let shown = super::without_credentials("amqp://gu,est:hunter2@rabbit:5672/%2f");
        assert!(!shown.contains("gu"), "{shown}");
    }

    /// A `/` in a password, not percent-encoded: the `@` comes after what
    /// parses as the host (found by the attacker's review).
    #[test]
    fn a_slash_in_a_password_does_not_reach_the_log() {
        let shown = super::without_credentials("amqp://guest:123/hunter2@127.0.0.1:5672/%2f");
        assert_eq!(shown, "amqp://[redacted]@127.0.0.1:5672/%2f");
        let shown = super::without_credentials("amqps://h:5671/vhost?x=1");
        assert_eq!(shown, "amqps://h:5671/vhost?x=1");
    }
}
