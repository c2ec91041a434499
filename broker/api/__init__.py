"""The management API (docs/api.md): any node answers for the whole fleet, from the store and by asking
the node a client is connected to. app: HTTP and keys; fleet: the fleet-wide view; local: what this node
answers about its own connections; models: the requests and answers; openapi: the document."""
