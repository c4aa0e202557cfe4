#!/usr/bin/env python3
"""One broker user per target, for least privilege among agents: prints a
RabbitMQ definitions fragment (users and permissions) for every target of a
routing table, to import next to deploy/rabbitmq/definitions.json:

    python3 scripts/agent-users.py [ROUTES] > agents.json
    rabbitmqctl import_definitions < agents.json     (then set each password)

User `agent-<project>-<target>` may declare, read and consume only its own
target's queue `frontdesk.agent.<project>.<target>`, and write only to the
default exchange (replies go to `reply_to`). Passwords are not in the file
(empty hash: nobody can log in until one is set)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(os.path.dirname(HERE), "Shared", "FrontDeskModel", "Resources", "routes.example.json")


def main(argv):
    path = argv[1] if len(argv) > 1 else os.environ.get("FRONTDESK_ROUTES", DEFAULT)
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    users, permissions = [], []
    for project in table["projects"]:
        for target in project["targets"]:
            name = f"agent-{project['id']}-{target['id']}"
            # Ids are [a-z0-9-]: only the dots need escaping.
            queue = "^frontdesk\\.agent\\." + project["id"] + "\\." + target["id"] + "$"
            users.append({"name": name, "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
                          "tags": [], "limits": {}})
            permissions.append({"user": name, "vhost": "frontdesk", "configure": queue, "write": "^amq\\.default$", "read": queue})
    json.dump({"users": users, "permissions": permissions}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
