#include "objstore/s3_xml.h"

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace sluice::objstore {
namespace {

struct DocFree {
  void operator()(xmlDoc* d) const { xmlFreeDoc(d); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

Doc Parse(absl::string_view xml) {
  if (xml.empty() || xml.size() > (64u << 20)) return nullptr;
  return Doc(xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "s3.xml", nullptr,
                           XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
}

bool Named(const xmlNode* n, const char* name) {
  return n != nullptr && n->type == XML_ELEMENT_NODE &&
         xmlStrcmp(n->name, reinterpret_cast<const xmlChar*>(name)) == 0;
}

const xmlNode* Child(const xmlNode* parent, const char* name) {
  for (const xmlNode* c = parent->children; c != nullptr; c = c->next) {
    if (Named(c, name)) return c;
  }
  return nullptr;
}

std::string Text(const xmlNode* n) {
  if (n == nullptr) return "";
  xmlChar* s = xmlNodeGetContent(n);
  std::string out = s == nullptr ? "" : reinterpret_cast<const char*>(s);
  xmlFree(s);
  return out;
}

std::string ChildText(const xmlNode* parent, const char* name) { return Text(Child(parent, name)); }

absl::StatusOr<const xmlNode*> Root(const Doc& doc, const char* name) {
  const xmlNode* root = doc == nullptr ? nullptr : xmlDocGetRootElement(doc.get());
  if (!Named(root, name)) {
    return absl::DataLossError(
        absl::StrCat("the object store's answer is not the <", name, "> expected"));
  }
  return root;
}

std::string Unquoted(std::string s) {
  absl::string_view v = s;
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"')
    return std::string(v.substr(1, v.size() - 2));
  return s;
}

}  // namespace

absl::StatusOr<ObjectList> ParseListObjects(absl::string_view xml) {
  Doc doc = Parse(xml);
  absl::StatusOr<const xmlNode*> root = Root(doc, "ListBucketResult");
  if (!root.ok()) return root.status();
  ObjectList list;
  list.truncated = ChildText(*root, "IsTruncated") == "true";
  list.next_token = ChildText(*root, "NextContinuationToken");
  for (const xmlNode* c = (*root)->children; c != nullptr; c = c->next) {
    if (!Named(c, "Contents")) continue;
    ObjectInfo o;
    o.key = ChildText(c, "Key");
    o.etag = Unquoted(ChildText(c, "ETag"));
    if (o.key.empty() || !absl::SimpleAtoi(ChildText(c, "Size"), &o.size)) {
      return absl::DataLossError("the object store listed an object without a key or a size");
    }
    list.objects.push_back(std::move(o));
  }
  if (list.truncated && list.next_token.empty()) {
    return absl::DataLossError("the object store's list is truncated but gives no token");
  }
  return list;
}

absl::StatusOr<UploadList> ParseListUploads(absl::string_view xml) {
  Doc doc = Parse(xml);
  absl::StatusOr<const xmlNode*> root = Root(doc, "ListMultipartUploadsResult");
  if (!root.ok()) return root.status();
  UploadList list;
  list.truncated = ChildText(*root, "IsTruncated") == "true";
  list.next_key_marker = ChildText(*root, "NextKeyMarker");
  list.next_upload_id_marker = ChildText(*root, "NextUploadIdMarker");
  for (const xmlNode* c = (*root)->children; c != nullptr; c = c->next) {
    if (!Named(c, "Upload")) continue;
    UploadInfo u{ChildText(c, "Key"), ChildText(c, "UploadId")};
    if (u.key.empty() || u.upload_id.empty()) {
      return absl::DataLossError("the object store listed an upload without a key or an id");
    }
    list.uploads.push_back(std::move(u));
  }
  if (list.truncated && list.next_key_marker.empty()) {
    return absl::DataLossError("the object store's upload list is truncated but gives no marker");
  }
  return list;
}

absl::StatusOr<std::string> ParseUploadId(absl::string_view xml) {
  Doc doc = Parse(xml);
  absl::StatusOr<const xmlNode*> root = Root(doc, "InitiateMultipartUploadResult");
  if (!root.ok()) return root.status();
  std::string id = ChildText(*root, "UploadId");
  if (id.empty()) return absl::DataLossError("the object store's new upload has no UploadId");
  return id;
}

S3Error ParseError(absl::string_view xml) {
  Doc doc = Parse(xml);
  const xmlNode* root = doc == nullptr ? nullptr : xmlDocGetRootElement(doc.get());
  if (!Named(root, "Error")) return {};
  return {ChildText(root, "Code"), ChildText(root, "Message")};
}

}  // namespace sluice::objstore
