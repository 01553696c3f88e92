"""A hosted model's vendor as the whole fleet sees it: its configuration, its limits held in
Redis (rate, concurrency, a shared pause, a circuit breaker) and the outcome classification."""
