/* protobuf-c messages <-> YAML / JSON through descriptors (no per-message code). Used by pcsctl
 * (job files, --json output), the planner's offline mode and tests.
 *
 * YAML mapping: keys are proto field names; enums are their value names without the enum's
 * common prefix, case-insensitive (`bf16` -> DTYPE_BF16, `full_shard` -> STRATEGY_FULL_SHARD);
 * a scalar may stand for a message that has one field or a oneof of scalars (`weight_decay: 0.01`
 * fills OptDouble.value, `reshard_after_forward: 2` fills group_size); a sequence may stand for a
 * message with exactly one repeated field (`module_class: [MLPBlock]`). `default` leaves a field
 * unset. JSON is YAML, so JSON files are accepted as they are. Unknown keys are errors. */
#ifndef PCS_PBTEXT_H
#define PCS_PBTEXT_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#include "pcs/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse YAML/JSON text into a new message of type `d`. On success *out must be freed with
 * protobuf_c_message_free_unpacked(*out, NULL). On error returns PCS_ERR_INVALID_ARG and
 * pcs_last_error() says "line L: field.path: rule" (e.g. "line 12: training.optimizer.adamw.lr:
 * expected a number, got 'fast'"). */
pcs_status_t pcs_pb_from_yaml(const char *text, size_t len, const ProtobufCMessageDescriptor *d,
                              ProtobufCMessage **out);
/* Same, reading a file (errors name the file). */
pcs_status_t pcs_pb_from_yaml_file(const char *path, const ProtobufCMessageDescriptor *d,
                                   ProtobufCMessage **out);
/* Render a message as JSON in pcs's job-file style (field names as in proto, enums lower-case
 * without prefix, 64-bit integers as numbers, one-field wrappers and scalar oneofs as plain
 * scalars, bytes as base64): what people write in job files. indent 0 = compact. *out is
 * malloc'd; caller frees. */
pcs_status_t pcs_pb_to_json(const ProtobufCMessage *m, int indent, char **out);
/* Render a message in proto3's canonical JSON mapping, which every protobuf library parses
 * (Python json_format, Go protojson, JavaScript): lowerCamelCase field names, enum value names
 * as in the .proto ("DTYPE_BF16"), 64-bit integers as strings (JavaScript numbers are doubles),
 * every message an object, "NaN" / "Infinity". pcsctl --json prints this; pb_yaml.c reads it. */
pcs_status_t pcs_pb_to_json_canonical(const ProtobufCMessage *m, int indent, char **out);
/* Lower-case short name of an enum value ("bf16", "full_shard"); "?" if unknown. */
const char *pcs_pb_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
