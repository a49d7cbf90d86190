# shellcheck shell=bash
# Throwaway PKI for the Kubernetes test clusters, made with openssl: a CA, EC
# P-256 keys with certificates it signs, the service-account key pair and
# kubeconfigs that log in with a client certificate. It exists so that the
# one-node e2e cluster (tests/e2e-k8s/cluster.sh, needs root) and the
# admission-policy check (tests/e2e-k8s/admission_check.sh, etcd +
# kube-apiserver only, no root) set up their PKI the same way from one copy.
# Source it; it only defines functions (needs openssl, not root), does not
# change shell options and works under `set -euo pipefail`.
#
# Every function works in a directory DIR holding ca.key/ca.crt and the other
# keys and certificates (NAME.key, NAME.crt); openssl's messages go to
# DIR/openssl.log. On failure a function prints the tail of that log to stderr
# and returns 1.
#
#   pki_ca DIR SUBJECT DAYS            create DIR (mode 700), the CA key and cert
#   pki_cert DIR DAYS NAME SUBJECT EKU [SAN]
#                                      DIR/NAME.{key,crt} signed by the CA
#   pki_sa_keys DIR                    DIR/sa.key + DIR/sa.pub (service accounts)
#   pki_kubeconfig FILE DIR CERTNAME USER SERVER CLUSTER
#                                      FILE: USER at SERVER with DIR/CERTNAME.*

_pki_openssl() { # DIR ARGS...
    local dir=$1
    shift
    openssl "$@" 2>>"$dir/openssl.log"
}

_pki_fail() { # DIR WHAT
    echo "pki: openssl failed for $2:" >&2
    tail -n 20 "$1/openssl.log" >&2
    return 1
}

# pki_ca DIR SUBJECT DAYS: create DIR (mode 700) with an EC P-256 CA key
# (ca.key) and self-signed CA certificate (ca.crt), valid DAYS days.
pki_ca() {
    local dir=$1 subj=$2 days=$3
    mkdir -p "$dir" && chmod 700 "$dir" || return 1
    if ! { _pki_openssl "$dir" genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key" &&
        _pki_openssl "$dir" req -x509 -new -key "$dir/ca.key" -subj "$subj" -days "$days" \
            -sha256 -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
            -out "$dir/ca.crt"; }; then
        _pki_fail "$dir" "the CA"
    fi
}

# pki_cert DIR DAYS NAME SUBJECT EKU [SAN]: EC P-256 key DIR/NAME.key and
# certificate DIR/NAME.crt (extended key usage EKU, e.g. serverAuth or
# clientAuth; subjectAltName SAN if given), signed by DIR's CA, valid DAYS days.
pki_cert() {
    local dir=$1 days=$2 name=$3 subj=$4 eku=$5 san=${6:-}
    {
        echo "basicConstraints = critical, CA:FALSE"
        echo "keyUsage = critical, digitalSignature, keyEncipherment"
        echo "extendedKeyUsage = $eku"
        [[ -z $san ]] || echo "subjectAltName = $san"
    } >"$dir/$name.ext"
    if ! { _pki_openssl "$dir" genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$name.key" &&
        _pki_openssl "$dir" req -new -key "$dir/$name.key" -subj "$subj" -out "$dir/$name.csr" &&
        _pki_openssl "$dir" x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
            -CAcreateserial -CAserial "$dir/ca.srl" -days "$days" -sha256 \
            -extfile "$dir/$name.ext" -out "$dir/$name.crt"; }; then
        _pki_fail "$dir" "$name"
    fi
}

# pki_sa_keys DIR: the service-account signing key DIR/sa.key (EC P-256) and
# its public key DIR/sa.pub.
pki_sa_keys() {
    local dir=$1
    if ! { _pki_openssl "$dir" genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/sa.key" &&
        _pki_openssl "$dir" pkey -in "$dir/sa.key" -pubout -out "$dir/sa.pub"; }; then
        _pki_fail "$dir" "the service-account key"
    fi
}

# pki_kubeconfig FILE DIR CERTNAME USER SERVER CLUSTER: write FILE, a
# kubeconfig for USER at SERVER (cluster name CLUSTER, context USER@CLUSTER)
# trusting DIR/ca.crt and logging in with DIR/CERTNAME.crt and .key.
pki_kubeconfig() {
    local file=$1 dir=$2 cert=$3 user=$4 server=$5 cluster=$6
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $cluster
  cluster:
    server: $server
    certificate-authority: $dir/ca.crt
users:
- name: $user
  user:
    client-certificate: $dir/$cert.crt
    client-key: $dir/$cert.key
contexts:
- name: $user@$cluster
  context:
    cluster: $cluster
    user: $user
current-context: $user@$cluster
EOF
}
