"""Data parallelism: replicas behind one router that routes by cached prefix.

`prefix_tree.py` approximates each replica's radix cache by the prompts routed to it,
`policy.py` picks a replica (cache-aware or round-robin), `app.py` is the HTTP front end
(proxy, health checks, fail-over), `launch.py` runs `--dp-size` replicas behind it, and
`cli.py` is `radixgen router --worker-urls URL...`.
"""
