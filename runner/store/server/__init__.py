"""The server driver: the store on a Gremlin Server over the wire (gremlinpython 3.7's driver,
its requests answered in the calling thread, and cheaper serializers: :mod:`.driver`,
:mod:`.wire`); transactions, or one traversal at a time (:mod:`.probe`)."""
