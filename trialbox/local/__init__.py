"""The local twin: the synthesized stack on one machine. moto stands in for AWS (server mode,
state machines really executing), the Lambda handlers run in local processes, and pool
workers run the same worker loop with the bwrap backend."""
