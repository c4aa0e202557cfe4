/// The three endpoints every service answers (CONTRACT.md, Configuration).
public enum ProbeRoutes {
    /// `/healthz`: the process runs. `/readyz`: 200 only while `isReady()`.
    /// `/metrics`: the registry in Prometheus text format.
    public static func handler(isReady: @escaping @Sendable () -> Bool, metrics: MetricsRegistry) -> HTTPServer.Handler {
        { request in
            switch request.path {
            case "/healthz":
                return HTTPResponse(status: 200, body: "ok\n")
            case "/readyz":
                return isReady()
                    ? HTTPResponse(status: 200, body: "ready\n")
                    : HTTPResponse(status: 503, body: "not ready: not connected or topology not declared\n")
            case "/metrics":
                return HTTPResponse(status: 200, contentType: MetricsRegistry.contentType, body: metrics.render())
            default:
                return HTTPResponse(status: 404, body: "not found; try /healthz, /readyz or /metrics\n")
            }
        }
    }
}
