// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected), the checksum of
// every record of the durable session format (docs/state_format.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace drt {

// CRC-32C of data[0, size), continuing from `crc` (0 to start).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
// The table-driven version Crc32c falls back to without SSE4.2 (tests check
// both against the RFC 3720 vectors).
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc = 0);

}  // namespace drt
