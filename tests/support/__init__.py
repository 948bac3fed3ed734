"""What the tests share: real processes to test against and the helpers that drive them.

- `harness`: `gazette serve` children (`BrokerProcess`, `serving_broker`, `BrokerCluster`), gazctl runs
  (`run_gazctl`, `one_line_error`, `table_rows`), journal specs and Append/Apply RPCs, free ports, ROOT.
- `journals`: journals of a real broker through the client library (unique names, `new_journal`,
  `create_journal`, waiting for a primary) and the broker's /debug/metrics counters.
- `waiting`: `until`, polling a probe (awaited if it returns a coroutine) until a check accepts its value.
- `inprocess`: brokers assembled in the test's own event loop (`InProcessBroker`, `InProcessCluster`).
- `tls_certs`: a test CA and certificates (`make_pki`), an etcd and a broker speaking TLS.
- `store_emulators`: moto (s3://), fake-gcs-server (gs://) and Azurite (azure://) on loopback.
- `postgres`: a real PostgreSQL server in a temporary directory.
- `netfaults` (with `delay_wire`): brokers in Linux network namespaces, with injected network faults.
- `clock_shift`: runs a module with its wall clock shifted (a broker's `clock_offset`).
- `apps`, `cli_apps`: consumer applications counting messages by key; `cli_apps` is what
  `gazette consume tests.support.cli_apps:app` (or `:recorded_app`) loads.
- `spark_session`: a local SparkSession for the pipelines tests and the Spark benchmark.

Fixtures stay in the conftest.py files (tests/conftest.py: etcd, brokers, the stores' emulators).
"""
