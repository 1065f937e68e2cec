"""Webhooks signed by the providers' own libraries, as their services send them.

Usage: sign_webhooks.py < deliveries.json

Reads a JSON list of ``{"library", "secret", "body", "id"?, "later"?}`` and prints a JSON
list of the headers to send with each body (``[[name, value], ...]``), signed
now by:

- ``svix`` (``svix.webhooks.Webhook.sign``) under Svix's default header names,
  ``svix-id``, ``svix-timestamp``, ``svix-signature``;
- ``standardwebhooks`` (``standardwebhooks.webhooks.Webhook.sign``) under the
  specification's ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``;
- ``slack_sdk`` (``slack_sdk.signature.SignatureVerifier``) as
  ``X-Slack-Signature`` and ``X-Slack-Request-Timestamp``;
- ``stripe`` (``stripe.WebhookSignature.generate_signature_header``) as
  ``Stripe-Signature``.

Each signed delivery is first checked with the same library's own verifier,
so what Idem receives is what that library accepts.
"""

import json
import sys
import time
from datetime import datetime, timezone

import standardwebhooks.webhooks
import stripe
import svix.webhooks
from slack_sdk.signature import SignatureVerifier


def sign_svix(secret, msg_id, body, now):
    sig = svix.webhooks.Webhook(secret).sign(msg_id, datetime.fromtimestamp(now, timezone.utc), body)
    headers = {"svix-id": msg_id, "svix-timestamp": str(now), "svix-signature": sig}
    svix.webhooks.Webhook(secret).verify(body, headers)
    return headers


def sign_standard(secret, msg_id, body, now):
    hook = standardwebhooks.webhooks.Webhook(secret)
    sig = hook.sign(msg_id, datetime.fromtimestamp(now, timezone.utc), body)
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(now), "webhook-signature": sig}
    hook.verify(body, headers, json_parse=False)
    return headers


def sign_slack(secret, _id, body, now):
    verifier = SignatureVerifier(secret)
    sig = verifier.generate_signature(timestamp=str(now), body=body)
    headers = {"X-Slack-Signature": sig, "X-Slack-Request-Timestamp": str(now)}
    assert verifier.is_valid(body, str(now), sig), "slack_sdk refuses its own signature"
    return headers


def sign_stripe(secret, _id, body, now):
    header = stripe.WebhookSignature.generate_signature_header(body, secret, timestamp=now)
    stripe.WebhookSignature.verify_header(body, header, secret, tolerance=300)
    return {"Stripe-Signature": header}


SIGNERS = {
    "svix": sign_svix,
    "standardwebhooks": sign_standard,
    "slack_sdk": sign_slack,
    "stripe": sign_stripe,
}


def main():
    out = []
    for d in json.load(sys.stdin):
        # "later": seconds after now, for a provider's retry signed anew.
        now = int(time.time()) + int(d.get("later", 0))
        headers = SIGNERS[d["library"]](d["secret"], d.get("id"), d["body"], now)
        out.append(sorted(headers.items()))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
