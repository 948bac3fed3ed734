"""A serving process's machinery, broker or consumer (Gazette's `server/`, `task/` and
`mainboilerplate/`): `listener` (gRPC and HTTP/1.1 on one port), `http` (the HTTP/1.1 server:
connections, framing, the debug endpoints, CORS, a process's routes), `tls`, `channels` (gRPC
channels to peers), `logs`, `tuning` (malloc and open files), `rpc_decoding` (requests that do
not decode), `process` (gRPC server options, etcd credentials, stop signals, a start a signal may
cut short), `command` (the flags and checks `gazette serve` and `gazette consume` share, one-line
errors)."""
