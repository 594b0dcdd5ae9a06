"""Zone-aware routing of clients to proxies and of requests to upstream brokers."""
