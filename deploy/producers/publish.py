#!/usr/bin/env python3
"""Publishes dispatch requests with pika (pip install pika), publisher-confirmed.

    deploy/producers/publish.py "text" [COUNT] [--project P] [--target T]

AMQP_URL as for the services (default amqp://guest:guest@127.0.0.1:5672/%2f).
Prints each request's id; with COUNT > 1, a burst.
"""
import argparse
import datetime
import json
import os
import sys
import uuid

try:
    import pika
except ImportError:
    sys.exit("publish.py: pika is missing (pip install pika)")


def main() -> int:
    parser = argparse.ArgumentParser(description="Publish Front Desk dispatch requests.")
    parser.add_argument("text")
    parser.add_argument("count", nargs="?", type=int, default=1)
    parser.add_argument("--project")
    parser.add_argument("--target")
    args = parser.parse_args()
    url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()  # each publish waits for the broker's confirm
    for _ in range(args.count):
        body = {
            "id": str(uuid.uuid4()),
            "input": args.text,
            "createdAt": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
        if args.project:
            body["project"] = args.project
        if args.target:
            body["target"] = args.target
        channel.basic_publish(
            exchange="frontdesk.commands",
            routing_key="dispatch.request",
            body=json.dumps(body).encode(),
            properties=pika.BasicProperties(content_type="application/json", delivery_mode=2, type="frontdesk.dispatch.request.v1"),
            mandatory=True,
        )
        print(body["id"])
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
