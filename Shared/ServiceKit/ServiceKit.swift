import AMQP
