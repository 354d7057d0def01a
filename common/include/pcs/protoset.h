/* pcs.protoset: the FileDescriptorSet of pcs's API (every .proto under proto/, the services
 * included, with their imports and comments), built by protoc and embedded in pcs_proto.
 * `pcsctl protoset` writes it out for grpcurl (-protoset) and other dynamic gRPC clients. */
#ifndef PCS_PROTOSET_H
#define PCS_PROTOSET_H

#include <stddef.h>

extern const unsigned char pcs_protoset[];
extern const size_t pcs_protoset_len;

#endif
