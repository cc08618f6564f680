"""A real OTLP/gRPC trace receiver for the tests and bench:edge (e2e/lib/otlp.ts).

Built on the published OTLP protos as PyPI's opentelemetry-proto ships them (generated modules,
loaded from the package, nothing copied) and grpcio's server. It listens on 127.0.0.1 at a free
port, prints {"listening": <port>} as its first line, then one JSON line per
ExportTraceServiceRequest (google.protobuf.json_format, field names as in the .proto; bytes
fields in base64). With --discard it prints nothing more and only accepts (bench:edge).
"""
import json
import sys
import threading
from concurrent import futures

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, discard):
        self.discard = discard
        self.lock = threading.Lock()

    def Export(self, request, context):
        if not self.discard:
            line = json.dumps(MessageToDict(request, preserving_proto_field_name=True), separators=(",", ":"))
            with self.lock:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver("--discard" in sys.argv), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sys.stdout.write(json.dumps({"listening": port}) + "\n")
    sys.stdout.flush()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
