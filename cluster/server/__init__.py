"""A serving process's machinery, broker or consumer (Gazette's `server/` and `task/`): `listener`
(gRPC and HTTP/1.1 on one port), `tls`, `channels` (gRPC channels to peers), `logs`, `tuning`
(malloc and open files), `rpc_decoding` (requests that do not decode), `process` (gRPC server
options, etcd credentials, stop signals, a start a signal may cut short)."""
