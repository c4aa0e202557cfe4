import AMQP
import Foundation
import FrontDeskModel

extension SenderTerm {
    /// Looks for dispatch `id` in the park queues of targets without agents
    /// (with agents, parked dispatches come to this sender by themselves).
    /// The match comes back unacked, with the channel that holds it; every
    /// other message goes back to its queue.
    func findParked(_ id: String) async throws -> (AMQPDelivery, ParkedDispatch, AMQPChannel)? {
        for route in table.routes where !online(route) && (presence[route]?.parked ?? 1) > 0 {
            let channel = try await connection.openChannel()
            let count = try await channel.queueDeclare(SenderTopology.parkQueue(route), passive: true).messageCount
            guard count > 0 else {
                await channel.close()
                continue
            }
            try await channel.qos(prefetchCount: UInt16(min(count, 5000)))
            let consumer = try await channel.consume(queue: SenderTopology.parkQueue(route))
            // The park queue's messages arrive at once (prefetched); stop at
            // the count, or after 2 s with nothing new.
            let box = DeliveryBox()
            let reader = Task {
                do { for try await d in consumer { await box.append(d) } } catch {}
            }
            var last = -1, quietTurns = 0
            while true {
                let n = await box.count
                if n >= Int(min(count, 5000)) { break }
                if n == last { quietTurns += 1 } else { quietTurns = 0 }
                if quietTurns >= 20 { break }
                last = n
                try await Task.sleep(for: .milliseconds(100))
            }
            try? await consumer.cancel()
            reader.cancel()
            var match: (AMQPDelivery, ParkedDispatch)?
            for d in await box.all {
                if match == nil, d.properties.correlationID == id, let p = try? ParkedDispatch(jsonData: d.body) {
                    match = (d, p)
                } else {
                    try d.nack(requeue: true)
                }
            }
            if let match { return (match.0, match.1, channel) }
            await channel.close()
        }
        return nil
    }
}
