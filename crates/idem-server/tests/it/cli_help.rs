//! `idem serve -h`, `idem relay -h` and `idem consume -h`: every flag is
//! still there under its name, grouped under the headings listening,
//! database, keys, events, admin and demo (in that order for `serve`).

use clap::CommandFactory;
use idem_server::commands::Cli;

/// Each heading of `command` with its long flags, in the order the help
/// shows them (`None`: the plain `Options` list).
fn headings(command: &str) -> Vec<(Option<String>, Vec<String>)> {
    let cli = Cli::command();
    let sub = cli.find_subcommand(command).unwrap();
    let mut groups: Vec<(Option<String>, Vec<String>)> = Vec::new();
    for arg in sub.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let heading = arg.get_help_heading().map(str::to_owned);
        match groups.iter_mut().find(|(h, _)| *h == heading) {
            Some((_, flags)) => flags.push(long.to_owned()),
            None => groups.push((heading, vec![long.to_owned()])),
        }
    }
    groups
}

fn expect(groups: &[(Option<&str>, &[&str])]) -> Vec<(Option<String>, Vec<String>)> {
    groups
        .iter()
        .map(|(h, flags)| {
            (
                h.map(str::to_owned),
                flags.iter().map(|f| (*f).to_owned()).collect(),
            )
        })
        .collect()
}

#[test]
fn serve_help_groups_every_flag_under_its_heading() {
    let want = expect(&[
        (
            Some("Listening"),
            &[
                "listen",
                "header-read-timeout",
                "idle-timeout",
                "body-read-timeout",
                "max-connections",
                "max-buffered-bytes",
                "max-buffered-bytes-per-peer",
                "max-body-bytes",
            ],
        ),
        (
            Some("Database"),
            &["database-url", "database-pool", "gc-interval"],
        ),
        (Some("Keys"), &["key-ttl", "claim-mode", "handler-timeout"]),
        (
            Some("Events"),
            &[
                "broker-url",
                "events",
                "nats-replicas",
                "consume",
                "ack-wait",
                "max-deliver",
            ],
        ),
        (
            Some("Admin"),
            &[
                "admin-token",
                "admin-hosts",
                "admin-lockout",
                "public-metrics",
            ],
        ),
        (
            Some("Demo"),
            &[
                "provider-url",
                "mail-url",
                "mail-delivery",
                "run-lease",
                "order-deadline",
                "call-timeout",
                "landing-margin",
                "max-runs",
                "respond-within",
                "bench-routes",
            ],
        ),
        (None, &["upstream", "config"]),
    ]);
    // `serve`'s own flags (the globals --log-format and --otlp-endpoint
    // are the command line's), as sets of (heading, flags).
    let got = headings("serve");
    let sorted = |mut g: Vec<(Option<String>, Vec<String>)>| {
        for (_, flags) in &mut g {
            flags.sort();
        }
        g.sort();
        g
    };
    assert_eq!(sorted(got.clone()), sorted(want.clone()));
    // The help shows the headings in this order.
    let help = Cli::command()
        .find_subcommand_mut("serve")
        .unwrap()
        .render_help()
        .to_string();
    let at = |h: &str| {
        help.find(&format!("\n{h}:\n"))
            .unwrap_or_else(|| panic!("no {h} heading in:\n{help}"))
    };
    let order: Vec<usize> = ["Listening", "Database", "Keys", "Events", "Admin", "Demo"]
        .iter()
        .map(|h| at(h))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{help}");
}

#[test]
fn relay_and_consume_share_the_headings() {
    for (command, own) in [
        ("relay", &["broker-url", "lease"][..]),
        ("consume", &["broker-url"][..]),
    ] {
        let groups = headings(command);
        let of = |h: &str| {
            groups
                .iter()
                .find(|(g, _)| g.as_deref() == Some(h))
                .map(|(_, f)| f.clone())
                .unwrap_or_default()
        };
        assert_eq!(
            of("Database"),
            ["database-url", "database-pool"],
            "{command}"
        );
        assert_eq!(of("Listening"), ["metrics-listen"], "{command}");
        assert_eq!(of("Admin"), ["admin-token", "public-metrics"], "{command}");
        let events = of("Events");
        for flag in own.iter().chain(&["nats-replicas"]) {
            assert!(events.iter().any(|f| f == flag), "{command}: {events:?}");
        }
    }
}
