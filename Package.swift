// swift-tools-version:6.0
import PackageDescription

/// Swift 6 language mode (strict concurrency) everywhere; `scripts/test.sh`
/// also builds with warnings as errors.
let package = Package(
    name: "frontdesk",
    products: [
        .executable(name: "frontdesk-router", targets: ["frontdesk-router"]),
        .executable(name: "frontdesk-sender", targets: ["frontdesk-sender"]),
        .executable(name: "frontdesk-gateway", targets: ["frontdesk-gateway"]),
        .executable(name: "frontdesk-pusher", targets: ["frontdesk-pusher"]),
        .executable(name: "frontdesk", targets: ["frontdesk"]),
        // The Live Activity's shape (ActivityKit attributes and content
        // state, the push payload): Foundation only, for the iOS app too.
        .library(name: "FrontDeskActivity", targets: ["FrontDeskActivity"]),
    ],
    targets: [
        // C: the calls Swift cannot make into rabbitmq-c (variadic, macros).
        .target(
            name: "CRabbitMQ",
            path: "Shared/CRabbitMQ",
            linkerSettings: [.linkedLibrary("rabbitmq")]
        ),
        // C: the HTTP server (libmicrohttpd) behind the probes.
        .target(
            name: "CMicroHTTPD",
            path: "Shared/CMicroHTTPD",
            linkerSettings: [.linkedLibrary("microhttpd")]
        ),
        // C: SHA-256 from OpenSSL's libcrypto (the gateway's token digests).
        .target(
            name: "CCrypto",
            path: "Shared/CCrypto",
            linkerSettings: [.linkedLibrary("crypto")]
        ),
        // C: an HTTP/2 client on libcurl (nghttp2), for APNs.
        .target(
            name: "CCurl",
            path: "Shared/CCurl",
            linkerSettings: [.linkedLibrary("curl")]
        ),
        .target(name: "FrontDeskActivity", path: "Shared/FrontDeskActivity"),
        // AMQP 0-9-1 client on rabbitmq-c: knows nothing of dispatches.
        .target(name: "AMQP", dependencies: ["CRabbitMQ"], path: "Shared/AMQP"),
        // The pure model: messages, routing table, resolver, state machine. No I/O.
        .target(
            name: "FrontDeskModel",
            dependencies: ["FrontDeskActivity"],
            path: "Shared/FrontDeskModel",
            resources: [.copy("Resources/routes.example.json")]
        ),
        // Configuration, logs, HTTP probes, metrics, lifecycle.
        .target(name: "ServiceKit", dependencies: ["AMQP", "FrontDeskModel", "CMicroHTTPD"], path: "Shared/ServiceKit"),

        .executableTarget(
            name: "frontdesk-router",
            dependencies: ["AMQP", "ServiceKit", "FrontDeskModel"],
            path: "Services/Router"
        ),
        .executableTarget(
            name: "frontdesk-sender",
            dependencies: ["AMQP", "ServiceKit", "FrontDeskModel"],
            path: "Services/Sender"
        ),
        .executableTarget(
            name: "frontdesk-gateway",
            dependencies: ["AMQP", "ServiceKit", "FrontDeskModel", "CCrypto"],
            path: "Services/Gateway",
            resources: [.copy("Page")]
        ),
        .executableTarget(
            name: "frontdesk-pusher",
            dependencies: ["AMQP", "ServiceKit", "FrontDeskModel", "FrontDeskActivity", "CCrypto", "CCurl"],
            path: "Services/Pusher"
        ),

        // The command line: dispatch, watch, cancel, reroute, route, agent.
        .executableTarget(name: "frontdesk", dependencies: ["AMQP", "FrontDeskModel", "ServiceKit"], path: "Tools/CLI"),

        // Benchmarks: print figures, assert nothing about speed.
        .target(name: "BenchmarkSupport", path: "Benchmarks/Support"),
        .target(name: "BenchmarkCSupport", path: "Benchmarks/CSupport", linkerSettings: [.linkedLibrary("rabbitmq")]),
        .executableTarget(name: "amqp-bench", dependencies: ["AMQP", "BenchmarkSupport"], path: "Benchmarks/AMQPBench"),
        .executableTarget(name: "router-bench", dependencies: ["AMQP", "BenchmarkSupport"], path: "Benchmarks/RouterBench"),
        .executableTarget(
            name: "router-c-relay",
            dependencies: ["BenchmarkCSupport"],
            path: "Benchmarks/RouterCRelay",
            linkerSettings: [.linkedLibrary("rabbitmq")]
        ),
        .executableTarget(name: "pipeline-bench", dependencies: ["AMQP", "BenchmarkSupport"], path: "Benchmarks/PipelineBench"),
        .executableTarget(
            name: "pipeline-c-relay",
            dependencies: ["BenchmarkCSupport"],
            path: "Benchmarks/PipelineCRelay",
            linkerSettings: [.linkedLibrary("rabbitmq")]
        ),
        .executableTarget(name: "sender-scale", dependencies: ["AMQP", "FrontDeskModel", "BenchmarkSupport"], path: "Benchmarks/SenderScale"),
        .executableTarget(name: "resolver-bench", dependencies: ["FrontDeskModel"], path: "Benchmarks/ResolverBench"),
        .executableTarget(
            name: "amqp-c-baseline",
            dependencies: ["BenchmarkCSupport"],
            path: "Benchmarks/AMQPCBaseline",
            linkerSettings: [.linkedLibrary("rabbitmq")]
        ),

        .testTarget(name: "AMQPTests", dependencies: ["AMQP", "CRabbitMQ"], path: "Tests/AMQPTests"),
        .testTarget(name: "ServiceKitTests", dependencies: ["ServiceKit"], path: "Tests/ServiceKitTests"),
        .testTarget(name: "FrontDeskModelTests", dependencies: ["FrontDeskModel", "FrontDeskActivity"], path: "Tests/FrontDeskModelTests"),
        // Against the local broker: the AMQP layer, and the services run as processes.
        .testTarget(name: "IntegrationTests", dependencies: ["AMQP"], path: "Tests/IntegrationTests"),
    ]
)
