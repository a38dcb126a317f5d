// Durable file operations for checkpoints and outputs: write-then-fsync,
// directory fsync, atomic rename of a finished directory, SHA-256 of a file.
// Every error is an IOError naming the path and errno's text.
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
// Reads a whole file.
StatusOr<std::string> ReadFileToString(const std::string& path);
// fsyncs a directory, so renames and creations inside it are durable.
Status SyncDirectory(const std::string& dir);
// Renames `from` to `to` (replacing an empty or absent `to`) and fsyncs the parent of `to`.
Status RenameDurably(const std::string& from, const std::string& to);
// Lowercase hex SHA-256 of a file's contents, and its size.
StatusOr<std::string> Sha256File(const std::string& path, uint64_t* size = nullptr);
std::string Sha256Hex(const std::string& data);

}  // namespace ft
