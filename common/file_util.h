// Durable file operations for checkpoints and outputs: write-then-fsync,
// directory fsync, atomic rename of a finished directory, SHA-256 of a file;
// bounded whole-file reads. Every error names the path (IOError with errno's
// text unless said otherwise).
//
// Every open here goes through OpenConfined (common/confined_path.h): with
// process roots set (ft-train --allowed-root), a path that resolves outside
// them is refused (InvalidArgument) when it is opened.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace ft {

// Writes all n bytes to an open descriptor (retrying short writes and EINTR);
// IOError names `path`.
Status WriteAll(int fd, const void* data, size_t n, const std::string& path);
// Writes `data` to `path` (truncating) and fsyncs it.
Status WriteFileDurably(const std::string& path, const std::string& data);
// Replaces `path` with `data` atomically: a crash leaves the old or the new
// contents, never a mix or an empty file (temp file, fsync, rename, dir fsync).
Status ReplaceFileAtomically(const std::string& path, const std::string& data);
// Size caps for whole-file reads: JSON configuration and index files
// (config.json, model.safetensors.index.json, checkpoint manifests and
// state, chat templates), and anything else read whole (the default).
constexpr uint64_t kMaxConfigFileBytes = uint64_t{16} << 20;
constexpr uint64_t kMaxWholeFileBytes = uint64_t{1} << 30;
// Reads a whole regular file of at most `max_bytes`. The file is opened
// O_NONBLOCK and fstat'ed first, so a FIFO, a device (/dev/zero) or a
// directory is refused at once instead of blocking or reading forever.
// NotFound when it does not exist; InvalidArgument naming the file and the
// limit when it is not a regular file or is larger than `max_bytes`.
StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes = kMaxWholeFileBytes);
// Opens `path` for reading when it is a regular file (O_NONBLOCK, then
// fstat); *size gets its size. Errors as ReadFileToString's.
StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size);
// fsyncs a directory, so renames and creations inside it are durable.
Status SyncDirectory(const std::string& dir);
// Renames `from` to `to` (replacing an empty or absent `to`) and fsyncs the parent of `to`.
Status RenameDurably(const std::string& from, const std::string& to);
// Lowercase hex SHA-256 of a regular file's contents, and its size.
StatusOr<std::string> Sha256File(const std::string& path, uint64_t* size = nullptr);
std::string Sha256Hex(const std::string& data);

}  // namespace ft
