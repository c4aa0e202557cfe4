#!/usr/bin/env python3
"""Asks the broker, as one user, whether an operation is allowed.

    amqp-permissions.py URL publish EXCHANGE ROUTING_KEY
    amqp-permissions.py URL consume QUEUE
    amqp-permissions.py URL declare QUEUE
    amqp-permissions.py URL bind EXCHANGE ROUTING_KEY   (a server-named queue of its own)

Prints "allowed" or "refused: <broker's reason>"; exit 0 either way, 2 on a
usage or connection error. Publishes use confirms, so a refusal is seen.
"""
import sys

import pika
import pika.exceptions


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    url, op = argv[1], argv[2]
    try:
        connection = pika.BlockingConnection(pika.URLParameters(url))
    except pika.exceptions.AMQPError as error:
        print(f"connection failed: {error!r}", file=sys.stderr)
        return 2
    channel = connection.channel()
    try:
        if op == "publish":
            channel.confirm_delivery()
            channel.basic_publish(argv[3], argv[4], b"{}", pika.BasicProperties(content_type="application/json"))
        elif op == "consume":
            channel.basic_qos(prefetch_count=10)  # streams require a prefetch
            channel.basic_consume(argv[3], lambda *_: None)
        elif op == "declare":
            channel.queue_declare(argv[3], durable=True, arguments={"x-queue-type": "quorum"})
        elif op == "bind":
            # Reading an exchange means binding a queue to it: the queue is the
            # user's own (server-named), the exchange is what is asked about.
            try:
                queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            except pika.exceptions.ChannelClosedByBroker as error:
                print(f"refused: {error.reply_code} {error.reply_text}")
                return 0
            channel.queue_bind(queue, argv[3], routing_key=argv[4])
        else:
            print(f"unknown operation {op}", file=sys.stderr)
            return 2
        print("allowed")
    except pika.exceptions.ChannelClosedByBroker as error:
        print(f"refused: {error.reply_code} {error.reply_text}")
    finally:
        if connection.is_open:
            connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
