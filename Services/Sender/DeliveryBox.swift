import AMQP

/// Deliveries gathered by a reader task.
actor DeliveryBox {
    private(set) var all: [AMQPDelivery] = []
    var count: Int { all.count }
    func append(_ d: AMQPDelivery) { all.append(d) }
}
