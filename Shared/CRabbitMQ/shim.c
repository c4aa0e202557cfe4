#include "CRabbitMQ.h"

#include <sys/eventfd.h>

amqp_rpc_reply_t fd_amqp_login_plain(amqp_connection_state_t state,
                                     const char *vhost,
                                     int channel_max,
                                     int frame_max,
                                     int heartbeat,
                                     const amqp_table_t *client_properties,
                                     const char *user,
                                     const char *password) {
  return amqp_login_with_properties(state, vhost, channel_max, frame_max,
                                    heartbeat, client_properties,
                                    AMQP_SASL_METHOD_PLAIN, user, password);
}

const amqp_method_number_t FD_CONNECTION_CLOSE = AMQP_CONNECTION_CLOSE_METHOD;
const amqp_method_number_t FD_CONNECTION_CLOSE_OK = AMQP_CONNECTION_CLOSE_OK_METHOD;
const amqp_method_number_t FD_CONNECTION_BLOCKED = AMQP_CONNECTION_BLOCKED_METHOD;
const amqp_method_number_t FD_CONNECTION_UNBLOCKED = AMQP_CONNECTION_UNBLOCKED_METHOD;
const amqp_method_number_t FD_CHANNEL_CLOSE = AMQP_CHANNEL_CLOSE_METHOD;
const amqp_method_number_t FD_CHANNEL_CLOSE_OK = AMQP_CHANNEL_CLOSE_OK_METHOD;
const amqp_method_number_t FD_BASIC_DELIVER = AMQP_BASIC_DELIVER_METHOD;
const amqp_method_number_t FD_BASIC_ACK = AMQP_BASIC_ACK_METHOD;
const amqp_method_number_t FD_BASIC_NACK = AMQP_BASIC_NACK_METHOD;
const amqp_method_number_t FD_BASIC_RETURN = AMQP_BASIC_RETURN_METHOD;
const amqp_method_number_t FD_BASIC_CANCEL = AMQP_BASIC_CANCEL_METHOD;
const amqp_method_number_t FD_BASIC_CANCEL_OK = AMQP_BASIC_CANCEL_OK_METHOD;

const amqp_flags_t FD_PROP_CONTENT_TYPE = AMQP_BASIC_CONTENT_TYPE_FLAG;
const amqp_flags_t FD_PROP_CONTENT_ENCODING = AMQP_BASIC_CONTENT_ENCODING_FLAG;
const amqp_flags_t FD_PROP_HEADERS = AMQP_BASIC_HEADERS_FLAG;
const amqp_flags_t FD_PROP_DELIVERY_MODE = AMQP_BASIC_DELIVERY_MODE_FLAG;
const amqp_flags_t FD_PROP_PRIORITY = AMQP_BASIC_PRIORITY_FLAG;
const amqp_flags_t FD_PROP_CORRELATION_ID = AMQP_BASIC_CORRELATION_ID_FLAG;
const amqp_flags_t FD_PROP_REPLY_TO = AMQP_BASIC_REPLY_TO_FLAG;
const amqp_flags_t FD_PROP_EXPIRATION = AMQP_BASIC_EXPIRATION_FLAG;
const amqp_flags_t FD_PROP_MESSAGE_ID = AMQP_BASIC_MESSAGE_ID_FLAG;
const amqp_flags_t FD_PROP_TIMESTAMP = AMQP_BASIC_TIMESTAMP_FLAG;
const amqp_flags_t FD_PROP_TYPE = AMQP_BASIC_TYPE_FLAG;
const amqp_flags_t FD_PROP_USER_ID = AMQP_BASIC_USER_ID_FLAG;
const amqp_flags_t FD_PROP_APP_ID = AMQP_BASIC_APP_ID_FLAG;

int fd_amqp_send_heartbeat(amqp_connection_state_t state) {
  amqp_frame_t frame;
  frame.frame_type = AMQP_FRAME_HEARTBEAT;
  frame.channel = 0;
  return amqp_send_frame(state, &frame);
}

int fd_eventfd_create(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
