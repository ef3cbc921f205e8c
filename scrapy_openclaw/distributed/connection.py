"""The Redis client of distributed mode: one Redis, a Redis Cluster or a Sentinel-managed master.

``REDIS_URL`` pointing at any node of a cluster is detected (``INFO cluster``)
and answered with redis-py's cluster client; ``OPENCLAW_REDIS_SENTINELS``
(``host:port`` of the sentinels) with ``OPENCLAW_REDIS_SENTINEL_MASTER`` asks
the sentinels for the master. ``REDIS_PARAMS`` (scrapy-redis) apply to the
connections in every case; a ``redis_cls`` in them is scrapy-redis's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

_CLUSTER_PARAMS = (
    "socket_timeout",
    "socket_connect_timeout",
    "health_check_interval",
    "password",
    "username",
    "retry",
    "ssl",
)


def client_from_settings(settings: Any, config: OpenClawSettings | None = None) -> Any:
    """The client *settings*' ``REDIS_*`` (scrapy-redis's) and *config* (theirs validated) name."""
    from scrapy_redis.connection import get_redis_from_settings  # type: ignore[import-untyped]

    if config is None:
        config = OpenClawSettings.from_settings(settings)
    params = dict(settings.getdict("REDIS_PARAMS") or {})
    sentinels = config.redis_sentinels
    if sentinels:
        from redis.sentinel import Sentinel

        hosts = [(s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])) for s in sentinels]
        params.pop("redis_cls", None)
        master = config.redis_sentinel_master
        timeout = {k: params[k] for k in ("socket_timeout", "socket_connect_timeout") if k in params}
        return one_write(Sentinel(hosts, sentinel_kwargs=timeout, **params).master_for(master))
    client = one_write(get_redis_from_settings(settings))
    if "redis_cls" in params:
        return client

    def cluster(kwargs: dict[str, Any]) -> Any:
        from redis.cluster import RedisCluster

        url = settings.get("REDIS_URL")
        if url:
            return RedisCluster.from_url(url, **kwargs)
        host, port = settings.get("REDIS_HOST") or "localhost", int(settings.get("REDIS_PORT") or 6379)
        return RedisCluster(host=host, port=port, **kwargs)

    return _cluster_if_enabled(client, cluster, params)


def client_for_crawler(crawler: Crawler) -> Any:
    """The crawler's one client, for the queue and the shared health registry: one set of
    connections per node for the Redis thread that runs both (each connection costs a
    handshake of two or three round trips) and, on a cluster, one slot map."""
    from scrapy_openclaw.runtime import shared

    return shared(
        crawler,
        "distributed_client",
        lambda: client_from_settings(crawler.settings, OpenClawSettings.for_crawler(crawler)),
    )


class _OneWrite:
    """A connection that sends a pipeline in one write: redis-py writes it in pieces of about
    6 KB, and Redis reads each piece that arrives on its own as a request of its own (a syscall
    and an event-loop turn on both sides for one round trip)."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if isinstance(command, list) and len(command) > 1:
            command = [b"".join(command)]
        super().send_packed_command(command, check_health)  # type: ignore[misc]


_ONE_WRITE: dict[type, type] = {}


def one_write(client: Any) -> Any:
    """*client*, its pool's connections made :class:`_OneWrite` (whatever their class: TCP, TLS,
    a Unix socket, Sentinel's); a client without a pool (a cluster) as it is."""
    pool: Any = getattr(client, "connection_pool", None)
    base = getattr(pool, "connection_class", None)
    if not isinstance(base, type) or issubclass(base, _OneWrite):
        return client
    if base not in _ONE_WRITE:
        _ONE_WRITE[base] = type(f"OneWrite{base.__name__}", (_OneWrite, base), {})
    pool.connection_class = _ONE_WRITE[base]
    pool.disconnect(inuse_connections=False)  # (one made before, idle: the next ones are of the new class)
    return client


def is_cluster(client: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def client_for_url(url: str, **params: Any) -> Any:
    """A client for *url* alone: the cluster client when it points at a Redis Cluster."""
    import redis
    from redis.cluster import RedisCluster

    client = redis.Redis.from_url(url, **params)
    return _cluster_if_enabled(client, lambda kwargs: RedisCluster.from_url(url, **kwargs), params)


def _cluster_if_enabled(client: Any, cluster: Callable[[dict[str, Any]], Any], params: dict[str, Any]) -> Any:
    """*client*, or ``cluster(params it accepts)`` when the server says it is a cluster node."""
    from redis.exceptions import RedisError

    try:
        enabled = int(client.info("cluster").get("cluster_enabled", 0))
    except (RedisError, OSError):
        return client  # unreachable now: the caller's first command reports it
    if not enabled:
        return client
    upgraded = cluster({k: v for k, v in params.items() if k in _CLUSTER_PARAMS})
    client.close()
    return upgraded


def reply_text(value: Any) -> str:
    """A Redis reply as text, whether the client decodes responses or not."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def run_scripts(server: Any, calls: list[tuple[Any, list[Any], list[Any]]]) -> list[tuple[bool, Any]]:
    """redis-py ``Script`` calls ``(script, keys, args)`` in one pipeline per node, in order on
    each; ``(ok, reply or exception)`` for each call. A script a node does not have yet (or a
    cluster slot that moved) is run again on its own through *server*, which loads or redirects it.
    A connection error raises (nothing is known of the pipeline's calls)."""
    from redis.exceptions import NoScriptError, ResponseError

    groups: dict[Any, list[int]] = {}
    pipes: dict[Any, Any] = {}
    for i, (_, keys, _) in enumerate(calls):
        if is_cluster(server):  # (redis-py's cluster pipeline refuses EVALSHA: one plain pipeline per node)
            node = server.get_node_from_key(keys[0])
            where, make = node.name, one_write(node.redis_connection)
        else:
            where, make = None, server
        if where not in pipes:
            pipes[where] = make.pipeline(transaction=False)
        groups.setdefault(where, []).append(i)
        script, keys, args = calls[i]
        pipes[where].evalsha(script.sha, len(keys), *keys, *args)
    out: list[tuple[bool, Any]] = [(False, None)] * len(calls)
    for where, pipe in pipes.items():
        for i, res in zip(groups[where], pipe.execute(raise_on_error=False)):
            redirected = isinstance(res, ResponseError) and str(res).startswith(("MOVED", "ASK"))
            if isinstance(res, NoScriptError) or redirected:
                script, keys, args = calls[i]
                try:
                    res = script(keys=keys, args=args)
                except ResponseError as exc:
                    res = exc
            out[i] = (not isinstance(res, Exception), res)
    return out


def redis_location(crawler: Crawler) -> str:
    """Where our components look for Redis, for messages: the Sentinel master, or REDIS_URL (or
    host:port) with any password masked; the setting named."""
    config, settings = OpenClawSettings.for_crawler(crawler), crawler.settings
    if config.redis_sentinels:
        master, sentinels = config.redis_sentinel_master, ", ".join(config.redis_sentinels)
        return f"master {master!r} of sentinel(s) {sentinels} (OPENCLAW_REDIS_SENTINELS)"
    url = settings.get("REDIS_URL")
    if url:
        return f"{mask_uri(url)} (REDIS_URL)"
    return f"redis://{settings.get('REDIS_HOST') or 'localhost'}:{settings.get('REDIS_PORT') or 6379} (REDIS_URL)"
