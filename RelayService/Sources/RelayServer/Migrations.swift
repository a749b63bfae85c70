import Foundation

/// The server's own tables and functions in PostgreSQL, created and upgraded at start
/// (``RelayDatabase/migrate(logger:)``): each migration runs once, in order, in one
/// transaction with the version it brings, under an advisory lock so that servers starting
/// together take turns.
///
/// What they hold mirrors a relay directory (docs/relay-format.md): per family its relay id
/// and the head of its append-only log (each stored delta takes the next position), the
/// sites that wrote or read (a `seen` time for readers), delta files with their source and
/// history range, checkpoints with their coverage, acknowledgements, full-snapshot requests
/// and parked notes. Bodies are the relay files' bytes, opaque to the server.
enum Migrations {
    /// `(version, SQL)`, in order. Never edit a published one: add the next.
    static let all: [(version: Int, sql: String)] = [(1, version1), (2, version2)]

    /// The statements of `sql`, split at each `;` that is outside a string, a `$$`-quoted body
    /// and a `--` comment (PostgreSQL's extended protocol runs one statement per query).
    static func statements(_ sql: String) -> [String] {
        var result: [String] = []
        var current = ""
        var inString = false, inBody = false, inComment = false
        var characters = sql.makeIterator()
        var previous: Character? = nil
        while let character = characters.next() {
            defer { previous = character }
            if inComment {
                if character == "\n" { inComment = false }
                current.append(character)
                continue
            }
            switch character {
            case "'" where !inBody: inString.toggle()
            case "$" where !inString && previous == "$": inBody.toggle()
            case "-" where !inString && !inBody && previous == "-": inComment = true
            case ";" where !inString && !inBody:
                let statement = current.trimmingCharacters(in: .whitespacesAndNewlines)
                if !statement.isEmpty { result.append(statement) }
                current = ""
                continue
            default: break
            }
            current.append(character)
        }
        let rest = current.trimmingCharacters(in: .whitespacesAndNewlines)
        if !rest.isEmpty && !rest.split(separator: "\n").allSatisfy({ $0.trimmingCharacters(in: .whitespaces).hasPrefix("--") }) {
            result.append(rest)
        }
        return result
    }

    static let version1 = #"""
    CREATE TABLE stash_relay_families (
        family      uuid PRIMARY KEY,
        token_hash  bytea NOT NULL,
        relay_id    uuid NOT NULL,
        head        bigint NOT NULL DEFAULT 0,
        created     timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE stash_relay_sites (
        family  uuid NOT NULL REFERENCES stash_relay_families ON DELETE CASCADE,
        site    uuid NOT NULL,
        seen    timestamptz NOT NULL,
        reads   boolean NOT NULL DEFAULT false,
        PRIMARY KEY (family, site)
    );
    CREATE TABLE stash_relay_files (
        family         uuid NOT NULL REFERENCES stash_relay_families ON DELETE CASCADE,
        position       bigint NOT NULL,
        source         uuid NOT NULL,
        first_seq      bigint NOT NULL,
        last_seq       bigint NOT NULL,
        full_snapshot  boolean NOT NULL,
        size           integer NOT NULL,
        body           bytea NOT NULL,
        stored         timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (family, position),
        UNIQUE (family, source, first_seq, last_seq, full_snapshot)
    );
    -- Sealed bodies do not compress: never try.
    ALTER TABLE stash_relay_files ALTER COLUMN body SET STORAGE EXTERNAL;
    CREATE TABLE stash_relay_checkpoints (
        family        uuid NOT NULL REFERENCES stash_relay_families ON DELETE CASCADE,
        maker         uuid NOT NULL,
        through       bigint NOT NULL,
        coverage      jsonb NOT NULL,
        coverage_sum  numeric NOT NULL,
        size          integer NOT NULL,
        body          bytea NOT NULL,
        stored        timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (family, maker, through)
    );
    ALTER TABLE stash_relay_checkpoints ALTER COLUMN body SET STORAGE EXTERNAL;
    CREATE TABLE stash_relay_acks (
        family   uuid NOT NULL REFERENCES stash_relay_families ON DELETE CASCADE,
        source   uuid NOT NULL,
        reader   uuid NOT NULL,
        through  bigint NOT NULL,
        PRIMARY KEY (family, source, reader)
    );
    CREATE TABLE stash_relay_requests (
        family  uuid NOT NULL REFERENCES stash_relay_families ON DELETE CASCADE,
        source  uuid NOT NULL,
        reader  uuid NOT NULL,
        PRIMARY KEY (family, source, reader)
    );
    CREATE TABLE stash_relay_parked (
        family  uuid NOT NULL REFERENCES stash_relay_families ON DELETE CASCADE,
        source  uuid NOT NULL,
        reader  uuid NOT NULL,
        note    bytea NOT NULL,
        PRIMARY KEY (family, source, reader)
    );

    -- A checkpoint's name on a relay directory (<maker>-<through, 20 digits>): for equal
    -- coverage, the later name is kept.
    CREATE FUNCTION stash_relay_checkpoint_name(maker uuid, through bigint) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$ SELECT maker::text || '-' || lpad(through::text, 20, '0') $$;

    -- Whether coverage a holds every source at least as far as coverage b.
    CREATE FUNCTION stash_relay_covers(a jsonb, b jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE AS $$
        SELECT NOT EXISTS (SELECT 1 FROM jsonb_each_text(b) e
                           WHERE coalesce((a ->> e.key)::numeric, 0) < e.value::numeric)
    $$;

    -- How far the family's checkpoints hold a site's history (0: none).
    CREATE FUNCTION stash_relay_covered(p_family uuid, p_site uuid) RETURNS bigint
    LANGUAGE sql STABLE AS $$
        SELECT coalesce(max((coverage ->> p_site::text)::bigint), 0)
        FROM stash_relay_checkpoints WHERE family = p_family
    $$;

    -- How far a source's history reached the relay: its newest file, or the newest
    -- acknowledgement of it (they stay after the files they acknowledge are cleaned up).
    CREATE FUNCTION stash_relay_published(p_family uuid, p_source uuid) RETURNS bigint
    LANGUAGE sql STABLE AS $$
        SELECT greatest(
            (SELECT coalesce(max(last_seq), 0) FROM stash_relay_files WHERE family = p_family AND source = p_source),
            (SELECT coalesce(max(through), 0) FROM stash_relay_acks WHERE family = p_family AND source = p_source))
    $$;

    -- Deletes a source's files that a checkpoint holds and every reader of the family heard
    -- from within p_stale has acknowledged; when a silent reader was left out, the source's
    -- newest file stays, so that the reader finds the gap when it comes back (the rules of
    -- RelayTransport's clean-up).
    CREATE FUNCTION stash_relay_clean_up(p_family uuid, p_source uuid, p_stale interval) RETURNS integer
    LANGUAGE plpgsql AS $$
    DECLARE
        v_covered bigint := stash_relay_covered(p_family, p_source);
        v_counted bigint;
        v_acknowledged bigint;
        v_stale_behind boolean;
        v_newest bigint;
        v_deleted integer;
    BEGIN
        IF v_covered = 0 THEN RETURN 0; END IF;
        SELECT count(*) FILTER (WHERE s.seen >= now() - p_stale),
               min(coalesce(a.through, 0)) FILTER (WHERE s.seen >= now() - p_stale),
               coalesce(bool_or(s.seen < now() - p_stale), false)
          INTO v_counted, v_acknowledged, v_stale_behind
          FROM stash_relay_sites s
          LEFT JOIN stash_relay_acks a ON a.family = s.family AND a.source = p_source AND a.reader = s.site
         WHERE s.family = p_family AND s.site <> p_source;
        IF v_counted = 0 THEN v_acknowledged := 9223372036854775807; END IF;
        SELECT position INTO v_newest FROM stash_relay_files
         WHERE family = p_family AND source = p_source ORDER BY last_seq DESC, position DESC LIMIT 1;
        DELETE FROM stash_relay_files
         WHERE family = p_family AND source = p_source AND last_seq <= v_covered AND last_seq <= v_acknowledged
           AND NOT (v_stale_behind AND position = v_newest);
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        RETURN v_deleted;
    END $$;

    -- Stores a delta file of p_source (or finds it stored: the same source and range), in the
    -- family's log at the next position (the server then notifies the family's long-polls, after
    -- the commit: see UploadNotifier). Returns
    -- ('stored' | 'duplicate', position, published), or ('siteReused', 0, published) when the
    -- relay holds the source's history past what its store has now (p_current).
    CREATE FUNCTION stash_relay_upload(p_family uuid, p_source uuid, p_first bigint, p_last bigint, p_full boolean,
                                       p_current bigint, p_body bytea, p_stale interval,
                                       OUT status text, OUT pos bigint, OUT published bigint)
    LANGUAGE plpgsql AS $$
    DECLARE
        v_answered uuid[];
    BEGIN
        -- Uploads of one family take turns: positions are then visible in their order.
        PERFORM 1 FROM stash_relay_families WHERE family = p_family FOR UPDATE;
        published := stash_relay_published(p_family, p_source);
        SELECT position INTO pos FROM stash_relay_files
         WHERE family = p_family AND source = p_source AND first_seq = p_first AND last_seq = p_last AND full_snapshot = p_full;
        IF FOUND THEN status := 'duplicate'; RETURN; END IF;
        IF published > p_last AND published > p_current THEN
            status := 'siteReused'; pos := 0; RETURN;
        END IF;
        PERFORM stash_relay_clean_up(p_family, p_source, p_stale);
        IF p_full THEN
            -- The requests present now are answered by this snapshot: their requesters'
            -- acknowledgements are lowered below it, so that the clean-up keeps it until they
            -- applied it, and the requests go. Requests written later stay for the next send.
            SELECT coalesce(array_agg(reader), '{}') INTO v_answered FROM stash_relay_requests
             WHERE family = p_family AND source = p_source;
            IF p_last > 0 THEN
                UPDATE stash_relay_acks SET through = p_last - 1
                 WHERE family = p_family AND source = p_source AND reader = ANY (v_answered) AND through >= p_last;
            END IF;
            DELETE FROM stash_relay_requests WHERE family = p_family AND source = p_source AND reader = ANY (v_answered);
        END IF;
        UPDATE stash_relay_families SET head = head + 1 WHERE family = p_family RETURNING head INTO pos;
        INSERT INTO stash_relay_files (family, position, source, first_seq, last_seq, full_snapshot, size, body)
             VALUES (p_family, pos, p_source, p_first, p_last, p_full, octet_length(p_body), p_body);
        -- A site that only writes is seen at its uploads (a reader at its reads), rewritten
        -- once a thirtieth of the stale age old, as a reader's: not a row version per upload.
        INSERT INTO stash_relay_sites (family, site, seen, reads) VALUES (p_family, p_source, now(), false)
            ON CONFLICT (family, site) DO UPDATE SET seen = now()
            WHERE NOT stash_relay_sites.reads AND stash_relay_sites.seen < now() - p_stale / 30;
        status := 'stored';
    END $$;

    -- Stores a checkpoint (replacing one of the same name), then removes those another one
    -- covers entirely (every source at least as far; for equal coverage, the later name wins).
    CREATE FUNCTION stash_relay_publish_checkpoint(p_family uuid, p_maker uuid, p_through bigint, p_coverage jsonb, p_body bytea)
    RETURNS integer LANGUAGE plpgsql AS $$
    DECLARE
        v_removed integer;
    BEGIN
        PERFORM 1 FROM stash_relay_families WHERE family = p_family FOR UPDATE;
        INSERT INTO stash_relay_checkpoints (family, maker, through, coverage, coverage_sum, size, body)
             VALUES (p_family, p_maker, p_through, p_coverage,
                     (SELECT coalesce(sum(value::numeric), 0) FROM jsonb_each_text(p_coverage)), octet_length(p_body), p_body)
        ON CONFLICT (family, maker, through) DO UPDATE
            SET coverage = excluded.coverage, coverage_sum = excluded.coverage_sum, size = excluded.size,
                body = excluded.body, stored = now();
        DELETE FROM stash_relay_checkpoints c
         WHERE c.family = p_family AND EXISTS (
               SELECT 1 FROM stash_relay_checkpoints o
                WHERE o.family = p_family AND (o.maker, o.through) <> (c.maker, c.through)
                  AND stash_relay_covers(o.coverage, c.coverage)
                  AND (NOT stash_relay_covers(c.coverage, o.coverage)
                       OR stash_relay_checkpoint_name(o.maker, o.through) > stash_relay_checkpoint_name(c.maker, c.through)));
        GET DIAGNOSTICS v_removed = ROW_COUNT;
        RETURN v_removed;
    END $$;

    -- Whether a checkpoint is due: the family's files no checkpoint covers number 64, or, at
    -- least 4 of them, outweigh both the largest checkpoint and 64 KiB.
    CREATE FUNCTION stash_relay_checkpoint_due(p_family uuid) RETURNS boolean
    LANGUAGE sql STABLE AS $$
        WITH uncovered AS (
            SELECT f.size FROM stash_relay_files f
             WHERE f.family = p_family AND f.last_seq > stash_relay_covered(p_family, f.source))
        SELECT count(*) >= 64
            OR (count(*) >= 4 AND coalesce(sum(size), 0) > greatest(
                   (SELECT coalesce(max(size), 0) FROM stash_relay_checkpoints WHERE family = p_family), 65536))
        FROM uncovered
    $$;

    -- What a reader needs to decide what to fetch, as JSON (one round trip): notes that it
    -- reads (its `seen` time, rewritten once p_seen_every old), cleans up its own files, then
    -- lists every other site with its files, how far it published, the reader's
    -- acknowledgement of it, and whether the reader left a request or a parked note there; and
    -- the family's checkpoints.
    CREATE FUNCTION stash_relay_state(p_family uuid, p_reader uuid, p_stale interval, p_seen_every interval) RETURNS json
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO stash_relay_sites (family, site, seen, reads) VALUES (p_family, p_reader, now(), true)
            ON CONFLICT (family, site) DO UPDATE SET seen = now(), reads = true
            WHERE NOT stash_relay_sites.reads OR stash_relay_sites.seen < now() - p_seen_every OR stash_relay_sites.seen > now();
        PERFORM stash_relay_clean_up(p_family, p_reader, p_stale);
        RETURN json_build_object(
            'relay', (SELECT relay_id FROM stash_relay_families WHERE family = p_family),
            'head', (SELECT head FROM stash_relay_families WHERE family = p_family),
            'sources', (SELECT coalesce(json_agg(json_build_object(
                    'site', s.site,
                    'published', stash_relay_published(p_family, s.site),
                    'ack', (SELECT through FROM stash_relay_acks a WHERE a.family = p_family AND a.source = s.site AND a.reader = p_reader),
                    'requested', EXISTS (SELECT 1 FROM stash_relay_requests r WHERE r.family = p_family AND r.source = s.site AND r.reader = p_reader),
                    'parkedNote', EXISTS (SELECT 1 FROM stash_relay_parked n WHERE n.family = p_family AND n.source = s.site AND n.reader = p_reader),
                    'files', (SELECT coalesce(json_agg(json_build_array(f.position, f.first_seq, f.last_seq, f.full_snapshot, f.size)
                                                      ORDER BY f.first_seq, f.last_seq, f.full_snapshot), '[]'::json)
                                FROM stash_relay_files f WHERE f.family = p_family AND f.source = s.site))
                    ORDER BY s.site::text), '[]'::json)
                FROM stash_relay_sites s WHERE s.family = p_family AND s.site <> p_reader),
            'checkpoints', (SELECT coalesce(json_agg(json_build_object(
                    'maker', c.maker, 'through', c.through, 'coverage', c.coverage, 'size', c.size)
                    ORDER BY c.coverage_sum, stash_relay_checkpoint_name(c.maker, c.through)), '[]'::json)
                FROM stash_relay_checkpoints c WHERE c.family = p_family));
    END $$;
    """#

    /// Blobs (``ExternalData``'s bytes, docs/relay-format.md "Blobs"): sealed envelopes of kind 4
    /// under the name the family's key gives them (an HMAC of their hash), once per family.
    static let version2 = #"""
    CREATE TABLE stash_relay_blobs (
        family  uuid NOT NULL REFERENCES stash_relay_families ON DELETE CASCADE,
        name    text NOT NULL,
        size    integer NOT NULL,
        body    bytea NOT NULL,
        stored  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (family, name)
    );
    ALTER TABLE stash_relay_blobs ALTER COLUMN body SET STORAGE EXTERNAL;
    """#
}
