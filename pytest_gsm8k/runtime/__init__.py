"""The runtime: what talks to the world (HTTP client, response cache, engine, the
xdist answer channel, the local model server, data files). No pytest here either.
"""
