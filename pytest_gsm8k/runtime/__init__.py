"""The runtime: what talks to the world (HTTP client, response cache, engine, the xdist
answer channel, model servers, data files). No pytest here either."""
