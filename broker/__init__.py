"""The Gazette broker: journals served over gRPC and HTTP on one port, persisted to fragment stores."""
