// s3_options.h: the URL, and credentials, region and endpoint resolved as AWS's tools resolve
// them, from a given environment and files (no process state touched).
#include "objstore/s3_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "tests/harness/status_matchers.h"

namespace sluice::objstore {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

struct World {
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> files;
  absl::Status Resolve(S3Options* o) const {
    return ResolveS3Options(
        o,
        [&](const std::string& k) -> std::optional<std::string> {
          auto it = env.find(k);
          if (it == env.end()) return std::nullopt;
          return it->second;
        },
        [&](const std::string& k) -> std::optional<std::string> {
          auto it = files.find(k);
          if (it == files.end()) return std::nullopt;
          return it->second;
        });
  }
};

TEST(S3OptionsTest, TheUrlGivesBucketAndPrefix) {
  ASSERT_OK_AND_ASSIGN(S3Options o, S3OptionsFromUrl("s3://my-bucket/shuffles/prod/"));
  EXPECT_EQ(o.bucket, "my-bucket");
  EXPECT_EQ(o.prefix, "shuffles/prod/");
  ASSERT_OK_AND_ASSIGN(S3Options bare, S3OptionsFromUrl("s3://my-bucket"));
  EXPECT_EQ(bare.prefix, "");
  EXPECT_EQ(bare.Url(), "s3://my-bucket/");
}

TEST(S3OptionsTest, ABadUrlSaysWhatIsWrong) {
  EXPECT_THAT(S3OptionsFromUrl("gs://b/x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "s3://bucket"));
  EXPECT_THAT(S3OptionsFromUrl("s3://"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid bucket name"));
  EXPECT_THAT(S3OptionsFromUrl("s3://Upper/x"), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(S3OptionsFromUrl("s3://bucket/a b"),
              StatusIs(absl::StatusCode::kInvalidArgument, "prefix"));
  EXPECT_THAT(S3OptionsFromUrl("s3://bucket/a/../b"),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(S3OptionsFromUrl("s3://bucket/a//b"),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

TEST(S3OptionsTest, KeysAreTheirOwnCanonicalUri) {
  EXPECT_TRUE(ValidObjectKey("s/job-1/p00012.v1"));
  EXPECT_TRUE(ValidObjectKey("team-a~job..7/p3")) << "every shuffle id is a segment";
  EXPECT_FALSE(ValidObjectKey(""));
  EXPECT_FALSE(ValidObjectKey("/abs"));
  EXPECT_FALSE(ValidObjectKey("a//b"));
  EXPECT_FALSE(ValidObjectKey("a/../b"));
  EXPECT_FALSE(ValidObjectKey("a/./b"));
  EXPECT_FALSE(ValidObjectKey("a/"));
  EXPECT_FALSE(ValidObjectKey("a=b"));
  EXPECT_FALSE(ValidObjectKey("a%20b"));
}

TEST(S3OptionsTest, TheEnvironmentComesFirst) {
  World w;
  w.env = {{"AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT01"},
           {"AWS_SECRET_ACCESS_KEY", "env-secret"},
           {"AWS_SESSION_TOKEN", "tok"},
           {"AWS_REGION", "eu-west-1"},
           {"HOME", "/home/u"}};
  w.files["/home/u/.aws/credentials"] =
      "[default]\naws_access_key_id = AKIAFILE\naws_secret_access_key = file-secret\n";
  ASSERT_OK_AND_ASSIGN(S3Options o, S3OptionsFromUrl("s3://bucket/p"));
  ASSERT_OK(w.Resolve(&o));
  EXPECT_EQ(o.credentials.access_key_id, "AKIAENVIRONMENT01");
  EXPECT_EQ(o.credentials.secret_access_key, "env-secret");
  EXPECT_EQ(o.credentials.session_token, "tok");
  EXPECT_EQ(o.region, "eu-west-1");
  EXPECT_EQ(o.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(*o.path_style) << "AWS: virtual-hosted";
}

TEST(S3OptionsTest, TheProfileOfTheSharedFiles) {
  World w;
  w.env = {{"AWS_PROFILE", "r2"}, {"HOME", "/home/u"}};
  w.files["/home/u/.aws/credentials"] =
      "[default]\naws_access_key_id=AKIADEFAULT\naws_secret_access_key=d\n"
      "# R2's keys\n[r2]\naws_access_key_id = R2KEYID123\naws_secret_access_key = r2-secret\n";
  w.files["/home/u/.aws/config"] = "[profile r2]\nregion = auto\n";
  S3Options o;
  o.bucket = "bucket";
  o.endpoint = "https://acct.r2.cloudflarestorage.com/";
  ASSERT_OK(w.Resolve(&o));
  EXPECT_EQ(o.credentials.access_key_id, "R2KEYID123");
  EXPECT_EQ(o.credentials.secret_access_key, "r2-secret");
  EXPECT_EQ(o.region, "auto");
  EXPECT_EQ(o.endpoint, "https://acct.r2.cloudflarestorage.com");
  EXPECT_TRUE(*o.path_style) << "a custom endpoint: path-style";
}

TEST(S3OptionsTest, FilesNamedByTheEnvironmentAndAnEndpointFromIt) {
  World w;
  w.env = {{"AWS_SHARED_CREDENTIALS_FILE", "/etc/creds"},
           {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000"}};
  w.files["/etc/creds"] = "[default]\naws_access_key_id=K1234567\naws_secret_access_key=S\n";
  S3Options o;
  o.bucket = "bucket";
  ASSERT_OK(w.Resolve(&o));
  EXPECT_EQ(o.credentials.access_key_id, "K1234567");
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(o.region, "us-east-1");
}

TEST(S3OptionsTest, MissingOrHalfCredentialsAreRefused) {
  World none;
  S3Options o;
  o.bucket = "bucket";
  EXPECT_THAT(none.Resolve(&o), StatusIs(absl::StatusCode::kInvalidArgument, "no credentials"));
  World half;
  half.env = {{"AWS_ACCESS_KEY_ID", "AKIA"}};
  S3Options o2;
  o2.bucket = "bucket";
  EXPECT_THAT(half.Resolve(&o2), StatusIs(absl::StatusCode::kInvalidArgument, "together"));
  World bad_endpoint;
  bad_endpoint.env = {{"AWS_ACCESS_KEY_ID", "AKIA"}, {"AWS_SECRET_ACCESS_KEY", "s"}};
  S3Options o3;
  o3.bucket = "bucket";
  o3.endpoint = "ftp://x";
  EXPECT_THAT(bad_endpoint.Resolve(&o3), StatusIs(absl::StatusCode::kInvalidArgument, "endpoint"));
}

TEST(S3OptionsTest, NoSecretInTheDebugString) {
  World w;
  w.env = {{"AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE"},
           {"AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
           {"AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLETOKEN"}};
  ASSERT_OK_AND_ASSIGN(S3Options o, S3OptionsFromUrl("s3://bucket/p"));
  ASSERT_OK(w.Resolve(&o));
  const std::string s = o.DebugString();
  EXPECT_THAT(s, Not(HasSubstr("wJalrXUtnFEMI")));
  EXPECT_THAT(s, Not(HasSubstr("FwoGZXIv")));
  EXPECT_THAT(s, Not(HasSubstr("AKIAIOSFODNN7EXAMPLE")));
  EXPECT_THAT(s, HasSubstr("AKIA…PLE"));
  EXPECT_THAT(s, HasSubstr("s3://bucket/p/"));
}

}  // namespace
}  // namespace sluice::objstore
