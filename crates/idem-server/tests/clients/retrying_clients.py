"""Real retrying clients against an HTTP API: what a Python team would use.

Usage: retrying_clients.py BASE_URL RUN_TAG INTENTS

For each of INTENTS intents, one per client library:
- ``requests`` with urllib3's ``Retry`` (any method, 502/503/504 retried)
  and a fixed ``Idempotency-Key`` for the intent;
- Stripe's own library (``stripe.StripeClient``, ``max_network_retries=3``),
  which draws an ``Idempotency-Key`` per request and reuses it on retries.

Every intent's body carries ``reference`` = ``<RUN_TAG>-<client>-<n>``, so the
caller can count the effects per intent upstream. Prints one JSON line per
intent: ``{"client", "reference", "status", "outcome"}`` (the final HTTP
status, or the exception's class when there was none).
"""

import json
import sys

import requests
import stripe
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


def with_requests(base, reference, n):
    session = requests.Session()
    retry = Retry(
        total=3,
        allowed_methods=None,
        status_forcelist=[502, 503, 504],
        backoff_factor=0.05,
        raise_on_status=False,
    )
    session.mount("http://", HTTPAdapter(max_retries=retry))
    try:
        r = session.post(
            base + "/v1/payments",
            json={"amount": 1000 + n, "currency": "EUR", "reference": reference},
            headers={"Idempotency-Key": "requests-" + reference},
            timeout=10,
        )
        return {"status": r.status_code, "outcome": "answered"}
    except Exception as e:  # the last attempt's failure, whatever it was
        return {"status": None, "outcome": type(e).__name__}


def with_stripe(base, reference, n):
    client = stripe.StripeClient(
        "sk_test_idem",
        base_addresses={"api": base},
        max_network_retries=3,
    )
    try:
        response = client.raw_request(
            "post",
            "/v1/payments",
            amount=2000 + n,
            currency="eur",
            reference=reference,
        )
        return {"status": response.code, "outcome": "answered"}
    except stripe.StripeError as e:
        return {"status": e.http_status, "outcome": type(e).__name__}
    except Exception as e:
        return {"status": None, "outcome": type(e).__name__}


def main():
    base, tag, intents = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stripe.enable_telemetry = False
    for name, send in (("requests", with_requests), ("stripe", with_stripe)):
        for n in range(intents):
            reference = "%s-%s-%d" % (tag, name, n)
            result = send(base, reference, n)
            result.update({"client": name, "reference": reference})
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
