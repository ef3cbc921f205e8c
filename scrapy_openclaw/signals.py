"""Signals that scrapy-openclaw components send through ``crawler.signals``.

Connect with ``crawler.signals.connect(handler, signal=openclaw_signals.X)``.
"""

#: A request or item was given up on. Arguments: ``dead_letter``
#: (:class:`scrapy_openclaw.deadletter.DeadLetter`), ``spider`` and, from the
#: retry middlewares, the failed ``request``. Sent exactly once per dead
#: letter; the DeadLetterPipeline stores it.
dead_letter = object()

#: A domain's circuit opened. Arguments: ``domain``, ``state`` (a
#: :class:`scrapy_openclaw.health.DomainState` snapshot), ``spider``.
circuit_opened = object()

#: A domain's circuit closed again after a successful probe. Same arguments.
circuit_closed = object()

#: A response was recognised as a ban or challenge page (error class ``blocked``) before
#: any callback saw it. Arguments: ``request``, ``response``, ``domain``,
#: ``classification`` (:class:`scrapy_openclaw.errors.Classification`, reason
#: ``blocked_<marker>``), ``retry_request`` (the delayed retry about to be scheduled, or
#: None when the request is given up as a dead letter), ``spider``. Rotate a proxy or a
#: session here, e.g. ``retry_request.meta["proxy"] = next_proxy``.
blocked = object()
