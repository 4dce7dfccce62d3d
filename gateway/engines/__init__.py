"""Talking to the engines: the client, its fair share of slots, and the adapters they
hold.

- ``engine_client``: the one engine client (SGLang ``/generate``), session-affine
  routing with failover;
- ``engine_share``: one engine's in-flight slots, shared fairly between projects;
- ``serving_cache``: the cached pointer to the adapter that serves each project;
- ``adapter_leases``: which adapters the requests in flight hold;
- ``adapter_sync``: every engine brought to the serving adapters;
- ``unloads``: a replaced version unloaded in the background once no request holds it.

Imports only ``edge``. Touch this when the engine protocol, routing between engines, or
how adapters are loaded, leased and unloaded changes.
"""
